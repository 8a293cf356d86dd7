package forge

/*
#include "forge.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// Token is one generated token: its id and the text it makes printable. Text may be empty
// while a UTF-8 character or a possible stop string is incomplete. When generation ends with
// text still held back, that text comes last as a Token with ID -1; the concatenated Text of
// all tokens is the generated text.
type Token struct {
	ID   int32
	Text string
}

// Message is one chat turn for Chat and RenderChat.
type Message struct {
	Role       string     // "system", "user", "assistant" (Qwen, Llama 3.1+, Mistral v0.3 / Nemo: also "tool", a tool's result)
	Content    string     // UTF-8
	ToolCalls  []ToolCall // an assistant message's tool calls (Llama 3.1+: one a message; Qwen 3, Qwen 3.5, Mistral)
	ToolCallID string     // a "tool" message's: the ID of the call it answers (Mistral v0.3 / Nemo need it)
}

// StopReason is a forge_stop_reason: why a generate or chat call stopped.
type StopReason int

// The forge_stop_reason values of forge.h.
const (
	StopNone      StopReason = 0
	StopEOS       StopReason = 1 // the model produced one of its end tokens
	StopToken     StopReason = 2 // one of the WithStopTokens ids
	StopString    StopReason = 3 // one of the WithStopStrings texts
	StopMaxTokens StopReason = 4 // WithMaxTokens tokens were generated
	StopCallback  StopReason = 5 // the consumer stopped (broke out of the range loop)
	StopContext   StopReason = 6 // the session's context is full
	StopCancelled StopReason = 7 // the context was cancelled, or the model closed
	// The constraint allows nothing more: the output matches it whole with nothing that may
	// follow (Metrics.ConstraintComplete), or no token of the vocabulary continues it.
	StopConstraint StopReason = 8
)

var stopNames = [...]string{"none", "eos", "stop token", "stop string", "max tokens", "callback", "context full", "cancelled", "constraint"}

// String returns a short lower-case name ("eos", "max tokens").
func (r StopReason) String() string {
	if r >= 0 && int(r) < len(stopNames) {
		return stopNames[r]
	}
	return "unknown"
}

// MemoryStats is forge_memory_stats: host and device memory of a model or session, in bytes.
type MemoryStats struct {
	HostArenaBytes     uint64 // host memory forge holds for the object
	DevicePlannedBytes uint64 // device memory the plan needs
	DeviceInUseBytes   uint64 // device memory allocated now
	DevicePeakBytes    uint64 // the most device memory allocated at once
	DeviceBuffers      uint64 // number of VkBuffers
	DeviceAllocations  uint64 // number of VkDeviceMemory allocations
	KVCacheBytes       uint64 // sessions: device bytes of the KV cache
	KVSlidingBytes     uint64 // sessions: of which sliding-window layers
	StateBytes         uint64 // sessions: the recurrent state of linear-attention layers (Qwen 3.5)
}

func memoryStats(m *C.forge_memory_stats) MemoryStats {
	return MemoryStats{
		HostArenaBytes:     uint64(m.host_arena_bytes),
		DevicePlannedBytes: uint64(m.device_planned_bytes),
		DeviceInUseBytes:   uint64(m.device_in_use_bytes),
		DevicePeakBytes:    uint64(m.device_peak_bytes),
		DeviceBuffers:      uint64(m.device_buffers),
		DeviceAllocations:  uint64(m.device_allocations),
		KVCacheBytes:       uint64(m.kv_cache_bytes),
		KVSlidingBytes:     uint64(m.kv_sliding_bytes),
		StateBytes:         uint64(m.state_bytes),
	}
}

// ModelInfo is forge_model_info: the model's architecture, shapes, weights and device.
type ModelInfo struct {
	Architecture     string // "llama", "qwen2", "qwen3", "gemma2", "gemma3"
	SourceFormat     string // "safetensors" or "gguf"
	WeightDType      string // dominant storage type of the matrices: "f32", "bf16", "q4_k", ...
	Name             string // general.name or the directory's name
	NumLayers        int
	HiddenSize       int
	NumHeads         int
	NumKVHeads       int
	HeadDim          int
	FFNSize          int // feed-forward (intermediate) size
	VocabSize        int
	ContextLen       int // the context length the model was trained with
	SlidingWindow    int // 0 when no layer uses a window
	NumSlidingLayers int
	TiedEmbeddings   bool
	NumParams        uint64 // parameters in the weight tensors
	WeightBytes      uint64 // bytes of weights on the device
	DeviceName       string
	DeviceDriver     string
	Memory           MemoryStats
}

func cstr(p *C.char, n int) string {
	b := unsafe.Slice((*byte)(unsafe.Pointer(p)), n)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func modelInfo(i *C.forge_model_info, mem *C.forge_memory_stats) ModelInfo {
	return ModelInfo{
		Architecture:     cstr(&i.architecture[0], len(i.architecture)),
		SourceFormat:     cstr(&i.source_format[0], len(i.source_format)),
		WeightDType:      cstr(&i.weight_dtype[0], len(i.weight_dtype)),
		Name:             cstr(&i.name[0], len(i.name)),
		NumLayers:        int(i.n_layers),
		HiddenSize:       int(i.hidden),
		NumHeads:         int(i.n_heads),
		NumKVHeads:       int(i.n_kv_heads),
		HeadDim:          int(i.head_dim),
		FFNSize:          int(i.ffn),
		VocabSize:        int(i.n_vocab),
		ContextLen:       int(i.n_ctx_train),
		SlidingWindow:    int(i.sliding_window),
		NumSlidingLayers: int(i.n_sliding_layers),
		TiedEmbeddings:   i.tied_embeddings != 0,
		NumParams:        uint64(i.n_params),
		WeightBytes:      uint64(i.weight_bytes),
		DeviceName:       cstr(&i.device_name[0], len(i.device_name)),
		DeviceDriver:     cstr(&i.device_driver[0], len(i.device_driver)),
		Memory:           memoryStats(mem),
	}
}

// Metrics is forge_metrics: the numbers of one generate, chat, classify or batch item.
type Metrics struct {
	PromptTokens        int           // tokens of the prompt (after the chat template)
	CachedTokens        int           // of which reused from the session's prompt cache
	GeneratedTokens     int           // tokens generated
	CacheWrapped        bool          // a cached prefix was lost to sliding-window layers
	TimeToFirstToken    time.Duration // call start to the first generated token
	PrefillDuration     time.Duration // evaluating the prompt
	DecodeDuration      time.Duration // generating after the first token
	PrefillTokensPerSec float64       // prompt tokens evaluated (not cached) per second
	DecodeTokensPerSec  float64       // generated tokens after the first, per second of decoding
	PeakMemoryBytes     uint64        // device memory peak of the model and its sessions
	PromptCacheHits     uint64        // calls on the session that reused a cached prefix (cumulative)
	StopReason          StopReason    // why the call stopped
	ContextSlides       int           // times the call slid a full context (WithOverflow)
	ConstraintComplete  bool          // with a constraint: the output matches it whole (else it stopped early, a prefix of a match)
	ForcedTokens        int           // generated tokens the constraint forced (written, not sampled)
	ConstraintMasks     int           // draws the device's candidates could not decide: the whole row was read on the host
	ConstraintDuration  time.Duration // host time on the constraint: compiling, checks, masks, forced text
	DraftTokens         int           // WithLookup: tokens drafted from the text and checked
	DraftAccepted       int           // of which kept (each equal to the token drawn at its place)
}

func ms(v C.double) time.Duration { return time.Duration(float64(v) * float64(time.Millisecond)) }

func metrics(m *C.forge_metrics) Metrics {
	return Metrics{
		PromptTokens:        int(m.prompt_tokens),
		CachedTokens:        int(m.cached_tokens),
		GeneratedTokens:     int(m.generated_tokens),
		CacheWrapped:        m.cache_wrapped != 0,
		TimeToFirstToken:    ms(m.ttft_ms),
		PrefillDuration:     ms(m.prefill_ms),
		DecodeDuration:      ms(m.decode_ms),
		PrefillTokensPerSec: float64(m.prefill_tok_s),
		DecodeTokensPerSec:  float64(m.decode_tok_s),
		PeakMemoryBytes:     uint64(m.peak_device_bytes),
		PromptCacheHits:     uint64(m.prompt_cache_hits),
		StopReason:          StopReason(m.stop_reason),
		ContextSlides:       int(m.context_slides),
		ConstraintComplete:  m.constraint_complete != 0,
		ForcedTokens:        int(m.forced_tokens),
		ConstraintMasks:     int(m.constraint_masks),
		ConstraintDuration:  ms(m.constraint_ms),
		DraftTokens:         int(m.draft_tokens),
		DraftAccepted:       int(m.draft_accepted),
	}
}

// ClassifyResult is one prompt's result from Classify: the token drawn from the logits after
// the prompt's last token (the argmax at temperature 0) with its text as it continues the
// prompt, the prompt's token count, with WithLogits those logits (VocabSize floats) and, with
// WithChoices, the index of the choice the model writes (greedy or drawn, token by token as
// Generate would), else -1. With a constraint the token is drawn among those it allows first.
type ClassifyResult struct {
	Token     Token
	NumTokens int
	Logits    []float32
	Choice    int
}

// BatchResult is one prompt's result from BatchGenerate: its tokens (as Generate would
// stream them), their text and metrics, or Err when this prompt failed on its own (too long,
// empty); the other prompts still ran.
type BatchResult struct {
	Tokens  []Token
	Text    string
	Metrics Metrics
	Err     error
}

// SpecialTokens is forge_special_tokens: the tokenizer's special ids, -1 where it has none.
type SpecialTokens struct {
	BOS, EOS, EOT, PAD, UNK int32
	SOT                     int32   // start of turn
	EOSIDs                  []int32 // every id that ends generation
}

// DeviceType is forge_device_type: the kind of a Vulkan device.
type DeviceType int

// The forge_device_type values of forge.h.
const (
	DeviceOther         DeviceType = 0
	DeviceIntegratedGPU DeviceType = 1
	DeviceDiscreteGPU   DeviceType = 2
	DeviceVirtualGPU    DeviceType = 3
	DeviceCPU           DeviceType = 4
)

// Device is forge_device_info: one Vulkan device. Pass its Index to WithDeviceIndex or part
// of its Name to WithDeviceName.
type Device struct {
	Index                 int
	Name                  string // "NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.6, 256 bits)"
	Driver                string
	Type                  DeviceType
	VendorID              uint32
	APIVersion            uint32
	DeviceLocalBytes      uint64
	MaxStorageBufferRange uint64
	MaxAllocationSize     uint64
	MaxBufferSize         uint64
	SubgroupSize          uint32
	FP16                  bool
	Int8                  bool
	IntegerDotProduct     bool
	CooperativeMatrix     bool
	Usable                bool // forge can run on it
}
