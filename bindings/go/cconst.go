package forge

/*
#include "forge.h"
*/
import "C"

// The package's constants are written as numbers, so that their documentation shows them; this
// fails to compile when one of them differs from forge.h's (an index out of range).
func _() {
	var x [1]struct{}
	_ = x[StatusOK-C.FORGE_OK]
	_ = x[StatusInvalidArgument-C.FORGE_ERR_INVALID_ARGUMENT]
	_ = x[StatusIO-C.FORGE_ERR_IO]
	_ = x[StatusFormat-C.FORGE_ERR_FORMAT]
	_ = x[StatusUnsupported-C.FORGE_ERR_UNSUPPORTED]
	_ = x[StatusModel-C.FORGE_ERR_MODEL]
	_ = x[StatusDevice-C.FORGE_ERR_DEVICE]
	_ = x[StatusOutOfMemory-C.FORGE_ERR_OUT_OF_MEMORY]
	_ = x[StatusLimit-C.FORGE_ERR_LIMIT]
	_ = x[StatusBufferTooSmall-C.FORGE_ERR_BUFFER_TOO_SMALL]
	_ = x[StatusCancelled-C.FORGE_ERR_CANCELLED]
	_ = x[StopNone-C.FORGE_STOP_NONE]
	_ = x[StopEOS-C.FORGE_STOP_EOS]
	_ = x[StopToken-C.FORGE_STOP_TOKEN]
	_ = x[StopString-C.FORGE_STOP_STRING]
	_ = x[StopMaxTokens-C.FORGE_STOP_MAX_TOKENS]
	_ = x[StopCallback-C.FORGE_STOP_CALLBACK]
	_ = x[StopContext-C.FORGE_STOP_CONTEXT]
	_ = x[StopCancelled-C.FORGE_STOP_CANCELLED]
	_ = x[StopConstraint-C.FORGE_STOP_CONSTRAINT]
	_ = x[ConstraintNone-C.FORGE_CONSTRAINT_NONE]
	_ = x[ConstraintGrammar-C.FORGE_CONSTRAINT_GBNF]
	_ = x[ConstraintJSONSchema-C.FORGE_CONSTRAINT_JSON_SCHEMA]
	_ = x[ConstraintJSONObject-C.FORGE_CONSTRAINT_JSON_OBJECT]
	_ = x[ConstraintChoices-C.FORGE_CONSTRAINT_CHOICES]
	_ = x[DeviceOther-C.FORGE_DEVICE_OTHER]
	_ = x[DeviceIntegratedGPU-C.FORGE_DEVICE_INTEGRATED_GPU]
	_ = x[DeviceDiscreteGPU-C.FORGE_DEVICE_DISCRETE_GPU]
	_ = x[DeviceVirtualGPU-C.FORGE_DEVICE_VIRTUAL_GPU]
	_ = x[DeviceCPU-C.FORGE_DEVICE_CPU]
	_ = x[OverflowFail-C.FORGE_OVERFLOW_FAIL]
	_ = x[OverflowShift-C.FORGE_OVERFLOW_SHIFT]
	_ = x[OverflowRecompute-C.FORGE_OVERFLOW_RECOMPUTE]
	_ = x[KVDefault-C.FORGE_KV_DEFAULT]
	_ = x[KVF32-C.FORGE_KV_F32]
	_ = x[KVF16-C.FORGE_KV_F16]
	_ = x[KVQ8_0-C.FORGE_KV_Q8_0]
	_ = x[PoolingDefault-C.FORGE_POOLING_DEFAULT]
	_ = x[PoolingLast-C.FORGE_POOLING_LAST]
	_ = x[PoolingMean-C.FORGE_POOLING_MEAN]
	_ = x[PoolingCLS-C.FORGE_POOLING_CLS]
	_ = x[ScheduleConstant-C.FORGE_LR_CONSTANT]
	_ = x[ScheduleLinear-C.FORGE_LR_LINEAR]
	_ = x[ScheduleCosine-C.FORGE_LR_COSINE]
	_ = x[AdapterPEFT-C.FORGE_ADAPTER_PEFT]
	_ = x[AdapterMLX-C.FORGE_ADAPTER_MLX]
}
