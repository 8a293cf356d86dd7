package forge

/*
#include <stdint.h>
#include <stdlib.h>
#include "forge.h"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// LRSchedule is forge_lr_schedule: how the learning rate moves after the warmup.
type LRSchedule int

// The forge_lr_schedule values of forge.h.
const (
	ScheduleConstant LRSchedule = 0 // lr
	ScheduleLinear   LRSchedule = 1 // lr decaying linearly to 0 at TotalSteps
	ScheduleCosine   LRSchedule = 2 // lr * 0.5 (1 + cos(pi * progress)) over TotalSteps
)

// AdapterFormat is forge_adapter_format: the files Trainer.Save writes.
type AdapterFormat int

// The forge_adapter_format values of forge.h.
const (
	AdapterPEFT AdapterFormat = 0 // adapter_config.json + adapter_model.safetensors (transformers + peft)
	AdapterMLX  AdapterFormat = 1 // adapter_config.json + adapters.safetensors (mlx-lm)
)

// TrainConfig is forge_train_params for LoRA fine-tuning with the cross-entropy loss.
// DefaultTrainConfig returns forge's defaults; TrainOptions change them.
type TrainConfig struct {
	Rank        int      // adapter rank (8)
	Alpha       float32  // scale = Alpha / Rank (16)
	Dropout     float32  // on the adapters' input (0)
	Targets     []string // HF projection names (q_proj, ..., down_proj) or "all" (q_proj, v_proj)
	Layers      int      // adapt the last Layers layers; 0: all
	Seed        uint64   // A's initialisation and the dropout masks
	AdapterPath string   // start from this adapter (PEFT or mlx-lm); "": fresh adapters
	LR          float64  // learning rate (1e-3)
	Beta1       float64  // AdamW (0.9)
	Beta2       float64  // AdamW (0.999)
	Eps         float64  // AdamW (1e-8)
	WeightDecay float64  // AdamW, decoupled (0.01)
	Schedule    LRSchedule
	WarmupSteps int     // linear warmup over this many optimizer steps
	TotalSteps  int     // the schedule's length (required by ScheduleLinear and ScheduleCosine)
	MaxGradNorm float64 // clip the global gradient norm to this; 0: off
	AccumSteps  int     // micro-batches per optimizer step (1)
	MaxBatch    int     // sequences per step: the device plan (4)
	MaxSeq      int     // tokens per sequence: the device plan (512)
}

// DefaultTrainConfig returns forge_train_default_params() as a TrainConfig.
func DefaultTrainConfig() TrainConfig {
	p := C.forge_train_default_params()
	return TrainConfig{
		Rank: int(p.rank), Alpha: float32(p.alpha), Dropout: float32(p.dropout),
		Targets: strings.Split(C.GoString(p.targets), ","), Layers: int(p.n_layers), Seed: uint64(p.seed),
		LR: float64(p.lr), Beta1: float64(p.beta1), Beta2: float64(p.beta2), Eps: float64(p.eps),
		WeightDecay: float64(p.weight_decay), Schedule: LRSchedule(p.schedule), WarmupSteps: int(p.warmup_steps),
		TotalSteps: int(p.total_steps), MaxGradNorm: float64(p.max_grad_norm), AccumSteps: int(p.accum_steps),
		MaxBatch: int(p.max_batch), MaxSeq: int(p.max_seq),
	}
}

// TrainOption changes a TrainConfig.
type TrainOption func(*TrainConfig)

// WithRank sets the adapters' rank and alpha (scale = alpha / rank).
func WithRank(rank int, alpha float32) TrainOption {
	return func(c *TrainConfig) { c.Rank, c.Alpha = rank, alpha }
}

// WithTargets sets the adapted projections: q_proj, k_proj, v_proj, o_proj, gate_proj,
// up_proj, down_proj, or "all".
func WithTargets(names ...string) TrainOption { return func(c *TrainConfig) { c.Targets = names } }

// WithLearningRate sets AdamW's learning rate.
func WithLearningRate(lr float64) TrainOption { return func(c *TrainConfig) { c.LR = lr } }

// WithSchedule sets the learning-rate schedule, its warmup and its length in optimizer steps.
func WithSchedule(s LRSchedule, warmup, total int) TrainOption {
	return func(c *TrainConfig) { c.Schedule, c.WarmupSteps, c.TotalSteps = s, warmup, total }
}

// WithTrainBatch sets the largest batch a step takes (the trainer's device plan).
func WithTrainBatch(sequences, tokens int) TrainOption {
	return func(c *TrainConfig) { c.MaxBatch, c.MaxSeq = sequences, tokens }
}

// WithTrainSeed sets the seed of A's initialisation and the dropout masks.
func WithTrainSeed(seed uint64) TrainOption { return func(c *TrainConfig) { c.Seed = seed } }

// WithStartAdapter starts from a saved adapter (its rank, alpha and targets replace the
// config's).
func WithStartAdapter(path string) TrainOption { return func(c *TrainConfig) { c.AdapterPath = path } }

// TrainBatch is one step's sequences of token ids (Model.Tokenize makes them from text); rows
// may differ in length. Labels (the same shape; -100 is not counted; nil: the tokens
// themselves, shifted inside as HuggingFace does) and Mask (0 leaves a position's label out)
// are optional.
type TrainBatch struct {
	Tokens [][]int32
	Labels [][]int32
	Mask   [][]uint8
}

// TrainStats is forge_train_stats: one step's numbers.
type TrainStats struct {
	Loss            float64 // the batch's mean loss before the update
	Tokens          int64   // counted targets
	GradNorm        float64 // global gradient norm before clipping (0 unless Applied)
	LR              float64 // learning rate applied (0 unless Applied)
	Applied         bool    // this step ended an accumulation and updated the adapters
	Step            int     // optimizer steps done so far
	Milliseconds    float64 // wall time of the call
	PeakDeviceBytes uint64
}

// Trainer is a forge_trainer: LoRA adapters on a Model, trained on the device with AdamW
// while the base weights stay frozen. Its calls run one at a time (a call made while another
// runs fails with ErrBusy); Model.Close closes it too.
type Trainer struct {
	m      *Model
	c      *C.forge_trainer // nil once freed
	busy   bool             // guarded by m.mu, as closed
	closed bool
}

// NewTrainer creates a trainer on the model from DefaultTrainConfig changed by opts. It fails
// with StatusOutOfMemory when the plan does not fit the device, StatusInvalidArgument on a
// bad option, StatusFormat or StatusModel on an adapter that is malformed or does not fit.
func (m *Model) NewTrainer(opts ...TrainOption) (*Trainer, error) {
	cfg := DefaultTrainConfig()
	for _, o := range opts {
		o(&cfg)
	}
	var a cmem
	defer a.free()
	p := (*C.forge_train_params)(a.alloc(C.sizeof_forge_train_params))
	*p = C.forge_train_default_params()
	p.rank, p.alpha, p.dropout = C.int(cfg.Rank), C.float(cfg.Alpha), C.float(cfg.Dropout)
	p.targets = a.str(strings.Join(cfg.Targets, ","))
	p.n_layers, p.seed = C.int(cfg.Layers), C.uint64_t(cfg.Seed)
	if cfg.AdapterPath != "" {
		p.adapter_path = a.str(cfg.AdapterPath)
	}
	p.lr, p.beta1, p.beta2, p.eps = C.double(cfg.LR), C.double(cfg.Beta1), C.double(cfg.Beta2), C.double(cfg.Eps)
	p.weight_decay, p.schedule = C.double(cfg.WeightDecay), C.forge_lr_schedule(cfg.Schedule)
	p.warmup_steps, p.total_steps = C.int(cfg.WarmupSteps), C.int(cfg.TotalSteps)
	p.max_grad_norm, p.accum_steps = C.double(cfg.MaxGradNorm), C.int(cfg.AccumSteps)
	p.max_batch, p.max_seq = C.int(cfg.MaxBatch), C.int(cfg.MaxSeq)
	cm, err := m.acquire()
	if err != nil {
		return nil, err
	}
	var ct *C.forge_trainer
	if st := C.forge_trainer_create(cm, p, &ct); st != C.FORGE_OK {
		err := m.errorf(cm, st)
		m.release()
		return nil, err
	}
	t := &Trainer{m: m, c: ct}
	m.mu.Lock()
	m.inflight--
	m.trainers[t] = struct{}{}
	if m.closed {
		t.closeLocked()
		m.mu.Unlock()
		return nil, ErrClosed
	}
	m.mu.Unlock()
	return t, nil
}

// Close frees the trainer (after a call still running on it returns). Closing twice is safe.
func (t *Trainer) Close() error {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	t.closeLocked()
	return nil
}

func (t *Trainer) closeLocked() {
	if t.closed {
		return
	}
	t.closed = true
	if !t.busy {
		t.freeLocked()
	}
}

func (t *Trainer) freeLocked() {
	if t.c == nil {
		return
	}
	C.forge_trainer_free(t.c)
	t.c = nil
	delete(t.m.trainers, t)
	t.m.maybeFreeLocked()
}

// call runs fn on the trainer's C object, one call at a time, and turns a failure into an
// *Error carrying the trainer's message.
func (t *Trainer) call(fn func(*C.forge_trainer) C.forge_status) error {
	t.m.mu.Lock()
	if t.closed {
		t.m.mu.Unlock()
		return ErrClosed
	}
	if t.busy {
		t.m.mu.Unlock()
		return ErrBusy
	}
	t.busy = true
	c := t.c
	t.m.mu.Unlock()
	st := fn(c)
	var err error
	if st != C.FORGE_OK {
		err = newError(st, C.forge_trainer_errmsg(c))
	}
	t.m.mu.Lock()
	t.busy = false
	if t.closed {
		t.freeLocked()
	}
	t.m.mu.Unlock()
	return err
}

// cBatch lays the batch out as forge_train_batch in C memory: rows right-padded to the
// longest, labels padded with -100.
func (a *cmem) cBatch(b TrainBatch) (*C.forge_train_batch, error) {
	n, width := len(b.Tokens), 0
	if n == 0 {
		return nil, &Error{Status: StatusInvalidArgument, Message: "the batch has no sequences"}
	}
	for _, r := range b.Tokens {
		width = max(width, len(r))
	}
	if width == 0 {
		return nil, &Error{Status: StatusInvalidArgument, Message: "every sequence of the batch is empty"}
	}
	check := func(what string, rows int, lens func(i int) int) error {
		if rows != n {
			return &Error{Status: StatusInvalidArgument, Message: what + " has a row count other than the tokens'"}
		}
		for i := 0; i < n; i++ {
			if lens(i) != len(b.Tokens[i]) {
				return &Error{Status: StatusInvalidArgument, Message: what + " rows must be as long as their token rows"}
			}
		}
		return nil
	}
	cb := (*C.forge_train_batch)(a.alloc(C.sizeof_forge_train_batch))
	cb.struct_size = C.sizeof_forge_train_batch
	cb.n_seqs, cb.seq_len = C.int(n), C.int(width)
	tokens := unsafe.Slice((*int32)(a.alloc(uintptr(4*n*width))), n*width)
	lengths := unsafe.Slice((*int32)(a.alloc(uintptr(4*n))), n)
	for i, r := range b.Tokens {
		copy(tokens[i*width:], r)
		lengths[i] = int32(len(r))
	}
	cb.tokens, cb.lengths = (*C.int32_t)(unsafe.Pointer(&tokens[0])), (*C.int32_t)(unsafe.Pointer(&lengths[0]))
	if b.Labels != nil {
		if err := check("Labels", len(b.Labels), func(i int) int { return len(b.Labels[i]) }); err != nil {
			return nil, err
		}
		labels := unsafe.Slice((*int32)(a.alloc(uintptr(4*n*width))), n*width)
		for i := range labels {
			labels[i] = -100
		}
		for i, r := range b.Labels {
			copy(labels[i*width:], r)
		}
		cb.labels = (*C.int32_t)(unsafe.Pointer(&labels[0]))
	}
	if b.Mask != nil {
		if err := check("Mask", len(b.Mask), func(i int) int { return len(b.Mask[i]) }); err != nil {
			return nil, err
		}
		mask := unsafe.Slice((*uint8)(a.alloc(uintptr(n*width))), n*width)
		for i, r := range b.Mask {
			copy(mask[i*width:], r)
		}
		cb.mask = (*C.uint8_t)(unsafe.Pointer(&mask[0]))
	}
	return cb, nil
}

// Step runs forward and backward on the batch; every AccumSteps-th call updates the adapters
// (TrainStats.Applied). StatusLimit past the planned batch, StatusInvalidArgument on an id
// outside the vocabulary or a batch with nothing counted.
func (t *Trainer) Step(b TrainBatch) (TrainStats, error) {
	var a cmem
	defer a.free()
	cb, err := a.cBatch(b)
	if err != nil {
		return TrainStats{}, err
	}
	s := C.forge_train_stats{struct_size: C.sizeof_forge_train_stats}
	if err := t.call(func(c *C.forge_trainer) C.forge_status { return C.forge_train_step(c, cb, &s) }); err != nil {
		return TrainStats{}, err
	}
	return TrainStats{Loss: float64(s.loss), Tokens: int64(s.tokens), GradNorm: float64(s.grad_norm), LR: float64(s.lr),
		Applied: s.applied != 0, Step: int(s.step), Milliseconds: float64(s.ms), PeakDeviceBytes: uint64(s.peak_device_bytes)}, nil
}

// Eval returns the batch's mean loss and counted targets without updating anything.
func (t *Trainer) Eval(b TrainBatch) (loss float64, tokens int64, err error) {
	var a cmem
	defer a.free()
	cb, err := a.cBatch(b)
	if err != nil {
		return 0, 0, err
	}
	var l C.double
	var n C.int64_t
	err = t.call(func(c *C.forge_trainer) C.forge_status { return C.forge_train_eval(c, cb, &l, &n) })
	return float64(l), int64(n), err
}

// Save writes the adapters to dir (created if missing), each file atomically. LoadModel with
// WithAdapterPath(dir), and NewTrainer with WithStartAdapter(dir), read both formats.
func (t *Trainer) Save(dir string, format AdapterFormat) error {
	var a cmem
	defer a.free()
	cdir := a.str(dir)
	return t.call(func(c *C.forge_trainer) C.forge_status {
		return C.forge_trainer_save(c, cdir, C.forge_adapter_format(format))
	})
}
