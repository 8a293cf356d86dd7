// Package forge is the Go binding of forge, an embeddable LLM runtime on Vulkan compute
// (cgo over libforge). It is shaped like go-mlx's inference.TextModel:
//
//	m, err := forge.LoadModel("models/stories260K/stories260K.gguf")
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer m.Close()
//	for tok := range m.Generate(ctx, "Once upon a time", forge.WithMaxTokens(64)) {
//		fmt.Print(tok.Text)
//	}
//	if err := m.Err(); err != nil {
//		log.Fatal(err)
//	}
//
// Generate and Chat return an iter.Seq[Token] that runs the generation as it is ranged over:
// breaking out of the loop stops generation before the next token, and cancelling ctx stops it
// too (Err then returns ctx.Err()). A Model may be used from any number of goroutines at once:
// each call runs on a session (KV cache, scratch, sampler) taken from the model's pool, and a
// session that served one call serves the next, so a conversation's next Chat turn reuses the
// prompt cache. A Session (NewSession) is one such session held explicitly.
//
// Failing calls return an *Error carrying forge's status and message; errors.Is(err,
// forge.StatusIO) tests the status.
package forge

/*
#include <stdlib.h>
#include "forge.h"
*/
import "C"

import (
	"context"
	"iter"
	"sync"
	"unsafe"
)

// TextModel is the inference interface of go-mlx's inference.TextModel, which *Model
// implements.
type TextModel interface {
	// Generate streams the tokens generated from prompt; see Model.Generate.
	Generate(ctx context.Context, prompt string, opts ...GenerateOption) iter.Seq[Token]
	// Chat renders messages with the model's chat template and streams the reply.
	Chat(ctx context.Context, messages []Message, opts ...GenerateOption) iter.Seq[Token]
	// Classify returns the token each prompt's last logits give, in one batched pass.
	Classify(ctx context.Context, prompts []string, opts ...GenerateOption) ([]ClassifyResult, error)
	// BatchGenerate generates for every prompt together.
	BatchGenerate(ctx context.Context, prompts []string, opts ...GenerateOption) ([]BatchResult, error)
	// ModelType returns the architecture ("llama", "qwen3", "gemma3").
	ModelType() string
	// Info returns the model's architecture, shapes and device.
	Info() ModelInfo
	// Metrics returns the numbers of the last call.
	Metrics() Metrics
	// Err returns the error of the last Generate or Chat, nil when it stopped normally.
	Err() error
	// Close releases the model.
	Close() error
}

var _ TextModel = (*Model)(nil)

// Version returns the linked libforge's version, "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.forge_version()) }

// Devices lists the Vulkan devices in the order forge's default choice prefers them
// (discrete, integrated, virtual, CPU). It fails with StatusDevice when there is no Vulkan
// loader or driver.
func Devices() ([]Device, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	var count C.int
	var errbuf [512]C.char
	st := C.forge_list_devices(nil, 0, &count, &errbuf[0], C.size_t(len(errbuf)))
	if st != C.FORGE_OK || count == 0 {
		return nil, newError(st, &errbuf[0])
	}
	infos := make([]C.forge_device_info, int(count))
	infos[0].struct_size = C.sizeof_forge_device_info // the array's element size (forge.h)
	st = C.forge_list_devices(&infos[0], count, &count, &errbuf[0], C.size_t(len(errbuf)))
	if st != C.FORGE_OK {
		return nil, newError(st, &errbuf[0])
	}
	out := make([]Device, 0, int(count))
	for i := 0; i < int(count) && i < len(infos); i++ {
		d := &infos[i]
		out = append(out, Device{
			Index: int(d.index), Name: cstr(&d.name[0], len(d.name)), Driver: cstr(&d.driver[0], len(d.driver)),
			Type: DeviceType(d._type), VendorID: uint32(d.vendor_id), APIVersion: uint32(d.api_version),
			DeviceLocalBytes: uint64(d.device_local_bytes), MaxStorageBufferRange: uint64(d.max_storage_buffer_range),
			MaxAllocationSize: uint64(d.max_allocation_size), MaxBufferSize: uint64(d.max_buffer_size),
			SubgroupSize: uint32(d.subgroup_size), FP16: d.fp16 != 0, Int8: d.int8 != 0,
			IntegerDotProduct: d.integer_dot_product != 0, CooperativeMatrix: d.cooperative_matrix != 0,
			Usable: d.usable != 0,
		})
	}
	return out, nil
}

// cmem is C memory for one call's arguments (structs that hold pointers must not live in Go
// memory when passed to C), freed together.
type cmem struct{ ptrs []unsafe.Pointer }

func (a *cmem) alloc(n uintptr) unsafe.Pointer {
	if n == 0 {
		n = 1
	}
	p := C.calloc(1, C.size_t(n))
	if p == nil {
		panic("forge: out of host memory")
	}
	a.ptrs = append(a.ptrs, p)
	return p
}

func (a *cmem) str(s string) *C.char {
	p := a.alloc(uintptr(len(s)) + 1)
	copy(unsafe.Slice((*byte)(p), len(s)), s)
	return (*C.char)(p)
}

func (a *cmem) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

// Model is a loaded model (forge_model): weights on the device, tokenizer, config, and a pool
// of sessions that its calls run on. It is safe for concurrent use.
type Model struct {
	path string
	cfg  LoadConfig
	info ModelInfo

	mu        sync.Mutex
	c         *C.forge_model // nil once freed
	closed    bool
	inflight  int                   // model-level calls running
	sessions  map[*Session]struct{} // live sessions (pooled and NewSession's)
	trainers  map[*Trainer]struct{} // live trainers
	idle      []*Session            // pooled sessions for Generate, Chat, Classify
	idleBatch []*Session            // pooled sessions for BatchGenerate
	lastErr   error
	last      Metrics
}

// LoadModel loads a model from path: a .gguf file, a directory holding config.json and
// *.safetensors (tokenizer.json beside them), or one .safetensors file beside its config.json.
// It fails with an *Error: StatusIO for a missing file, StatusFormat for a malformed one,
// StatusDevice when there is no usable Vulkan device, ...
func LoadModel(path string, opts ...LoadOption) (*Model, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	cfg := LoadConfig{DeviceIndex: -1}
	for _, o := range opts {
		o(&cfg)
	}
	var a cmem
	defer a.free()
	p := (*C.forge_model_params)(a.alloc(C.sizeof_forge_model_params))
	*p = C.forge_model_default_params()
	p.device_index = C.int(cfg.DeviceIndex)
	if cfg.DeviceName != "" {
		p.device_name = a.str(cfg.DeviceName)
	}
	if cfg.AdapterPath != "" {
		p.adapter_path = a.str(cfg.AdapterPath)
	}
	if cfg.AdapterMerge {
		p.adapter_merge = 1
	}
	if cfg.Exact {
		p.exact = 1
	}
	p.parallel_slots = C.int(cfg.ParallelSlots)
	p.max_device_memory = C.uint64_t(cfg.MaxDeviceMemory)
	var cm *C.forge_model
	st := C.forge_model_load(a.str(path), p, &cm)
	if st != C.FORGE_OK {
		if cm == nil {
			return nil, &Error{Status: Status(st), Message: "out of host memory"}
		}
		err := newError(st, C.forge_model_errmsg(cm))
		C.forge_model_free(cm)
		return nil, err
	}
	m := &Model{path: path, cfg: cfg, c: cm, sessions: map[*Session]struct{}{}, trainers: map[*Trainer]struct{}{}}
	info := C.forge_model_info{struct_size: C.sizeof_forge_model_info}
	mem := C.forge_memory_stats{struct_size: C.sizeof_forge_memory_stats}
	if C.forge_model_get_info(cm, &info) == C.FORGE_OK && C.forge_model_memory(cm, &mem) == C.FORGE_OK {
		m.info = modelInfo(&info, &mem)
	}
	return m, nil
}

// Path returns the path the model was loaded from.
func (m *Model) Path() string { return m.path }

// Info returns the model's architecture, shapes, parameter count and device (as at load).
func (m *Model) Info() ModelInfo { return m.info }

// ModelType returns the architecture identifier ("llama", "qwen3", "gemma3").
func (m *Model) ModelType() string { return m.info.Architecture }

// Close frees the model, its sessions and its trainers. Calls still running are cancelled (their Err is
// ErrClosed) and the memory is released when the last one returns. Closing twice is safe.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.idle, m.idleBatch = nil, nil
	for s := range m.sessions {
		s.closeLocked()
	}
	for t := range m.trainers {
		t.closeLocked()
	}
	m.maybeFreeLocked()
	return nil
}

// maybeFreeLocked frees the C model once it is closed and nothing uses it.
func (m *Model) maybeFreeLocked() {
	if m.closed && m.c != nil && m.inflight == 0 && len(m.sessions) == 0 && len(m.trainers) == 0 {
		C.forge_model_free(m.c)
		m.c = nil
	}
}

// acquire returns the C model for a model-level call; release must follow.
func (m *Model) acquire() (*C.forge_model, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.inflight++
	return m.c, nil
}

func (m *Model) release() {
	m.mu.Lock()
	m.inflight--
	m.maybeFreeLocked()
	m.mu.Unlock()
}

func (m *Model) errorf(cm *C.forge_model, st C.forge_status) error {
	return newError(st, C.forge_model_errmsg(cm))
}

// Err returns the error of the model's last Generate or Chat: nil when it stopped normally
// (end token, max tokens, a stop token or string, the consumer breaking out of the loop),
// ctx.Err() when its context was cancelled, an *Error when forge failed.
func (m *Model) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastErr
}

// Metrics returns the numbers of the model's last Generate, Chat, ChatTools, Classify or
// BatchGenerate (for BatchGenerate: the items' tokens, forced tokens, masks and constraint time
// summed, the other durations the call's; BatchResult.Metrics has each item's).
func (m *Model) Metrics() Metrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

func (m *Model) setResult(met Metrics, err error, setErr bool) {
	m.mu.Lock()
	m.last = met
	if setErr {
		m.lastErr = err
	}
	m.mu.Unlock()
}

// takeSession returns an idle pooled session or a new one.
func (m *Model) takeSession(batch bool) (*Session, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	pool := &m.idle
	if batch {
		pool = &m.idleBatch
	}
	if n := len(*pool); n > 0 {
		s := (*pool)[n-1]
		*pool = (*pool)[:n-1]
		m.mu.Unlock()
		return s, nil
	}
	m.mu.Unlock()
	cfg := SessionConfig{}
	if batch {
		cfg.Sequences = m.cfg.BatchSequences
		if cfg.Sequences == 0 {
			cfg.Sequences = 4
		}
	}
	return m.NewSession(cfg)
}

func (m *Model) putSession(s *Session, batch bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || m.closed {
		return
	}
	if batch {
		m.idleBatch = append(m.idleBatch, s)
	} else {
		m.idle = append(m.idle, s)
	}
}

func (m *Model) pooledSeq(seq func(*Session) iter.Seq[Token]) iter.Seq[Token] {
	return func(yield func(Token) bool) {
		s, err := m.takeSession(false)
		if err != nil {
			m.setResult(Metrics{}, err, true)
			return
		}
		defer func() {
			m.setResult(s.Metrics(), s.Err(), true)
			m.putSession(s, false)
		}()
		seq(s)(yield)
	}
}

// Generate returns the tokens generated from prompt (tokenized with the model's tokenizer,
// BOS added as it declares), streamed as the sequence is ranged over. Breaking out of the
// loop stops generation before the next token (StopCallback); cancelling ctx stops it too
// (StopCancelled, and Err returns ctx.Err()). Errors end the sequence and are returned by Err.
// Each range over the sequence generates anew. With a constraint (WithJSONSchema, WithGrammar,
// WithJSONObject, WithChoices) the output matches it; Metrics().ConstraintComplete tells a whole
// match from one cut short (by WithMaxTokens, say).
func (m *Model) Generate(ctx context.Context, prompt string, opts ...GenerateOption) iter.Seq[Token] {
	return m.pooledSeq(func(s *Session) iter.Seq[Token] { return s.Generate(ctx, prompt, opts...) })
}

// GenerateTokens is Generate from a prompt of token ids.
func (m *Model) GenerateTokens(ctx context.Context, prompt []int32, opts ...GenerateOption) iter.Seq[Token] {
	return m.pooledSeq(func(s *Session) iter.Seq[Token] { return s.GenerateTokens(ctx, prompt, opts...) })
}

// Chat renders messages with the model family's chat template (Llama 3, ChatML for Qwen,
// Gemma), then streams the assistant's reply as Generate does; the family's end-of-turn token
// ends it. A model without a known chat format gives no tokens and Err returns an *Error with
// StatusUnsupported. With WithTools the conversation is rendered with the tools and the reply
// streams as generated, tool calls included (ChatTools parses them out); a constraint
// (WithJSONSchema, ...) holds after a thinking reply's thinking.
func (m *Model) Chat(ctx context.Context, messages []Message, opts ...GenerateOption) iter.Seq[Token] {
	return m.pooledSeq(func(s *Session) iter.Seq[Token] { return s.Chat(ctx, messages, opts...) })
}

// Classify runs one batched forward pass per batch over prompts, no decode loop, and returns
// for each the token drawn from the logits after its last token (greedy by default: the
// argmax, which is the first token Generate would give) and, with WithLogits, those logits.
// Sampling options apply (WithTemperature, WithTopK, WithTopP, WithMinP, WithSeed), and a
// constraint: the token is drawn among those it allows first; with WithChoices each result's
// Choice is the choice the model writes.
func (m *Model) Classify(ctx context.Context, prompts []string, opts ...GenerateOption) ([]ClassifyResult, error) {
	s, err := m.takeSession(false)
	if err != nil {
		return nil, err
	}
	defer m.putSession(s, false)
	res, err := s.Classify(ctx, prompts, opts...)
	m.setResult(s.Metrics(), nil, false)
	return res, err
}

// BatchGenerate generates for every prompt together: up to WithBatchSequences sequences are
// decoded in lockstep, a finished one's place taken by the next prompt. Each result equals
// what Generate gives for its prompt alone (same tokens, same seeded draws, up to float
// rounding on devices whose batched products round differently). A prompt that fails on its
// own gets BatchResult.Err; a failure of the whole call is returned. When ctx is cancelled the
// results so far are returned with ctx.Err(). A constraint applies to every prompt.
func (m *Model) BatchGenerate(ctx context.Context, prompts []string, opts ...GenerateOption) ([]BatchResult, error) {
	s, err := m.takeSession(true)
	if err != nil {
		return nil, err
	}
	defer m.putSession(s, true)
	res, err := s.BatchGenerate(ctx, prompts, opts...)
	m.setResult(s.Metrics(), nil, false)
	return res, err
}

// Memory returns the model's host and device memory now.
func (m *Model) Memory() (MemoryStats, error) {
	cm, err := m.acquire()
	if err != nil {
		return MemoryStats{}, err
	}
	defer m.release()
	mem := C.forge_memory_stats{struct_size: C.sizeof_forge_memory_stats}
	if st := C.forge_model_memory(cm, &mem); st != C.FORGE_OK {
		return MemoryStats{}, m.errorf(cm, st)
	}
	return memoryStats(&mem), nil
}

// Tokenize returns the token ids of text as HuggingFace tokenizers' encode(text,
// add_special_tokens=addSpecial) gives them; special-token text ("<|eot_id|>") becomes its id.
func (m *Model) Tokenize(text string, addSpecial bool) ([]int32, error) {
	cm, err := m.acquire()
	if err != nil {
		return nil, err
	}
	defer m.release()
	var a cmem
	defer a.free()
	ct := a.str(text)
	var flags C.uint32_t
	if addSpecial {
		flags |= C.FORGE_TOKENIZE_ADD_SPECIAL
	}
	ids := make([]int32, len(text)+8)
	for {
		var n C.size_t
		st := C.forge_tokenize(cm, ct, C.size_t(len(text)), flags, (*C.int32_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)), &n)
		if st == C.FORGE_ERR_BUFFER_TOO_SMALL {
			ids = make([]int32, int(n))
			continue
		}
		if st != C.FORGE_OK {
			return nil, m.errorf(cm, st)
		}
		return ids[:int(n)], nil
	}
}

// Detokenize returns the text of ids, as HuggingFace's decode(ids, skip_special_tokens=False).
func (m *Model) Detokenize(ids []int32) (string, error) {
	cm, err := m.acquire()
	if err != nil {
		return "", err
	}
	defer m.release()
	var p *C.int32_t
	if len(ids) > 0 {
		p = (*C.int32_t)(unsafe.Pointer(&ids[0]))
	}
	buf := make([]byte, 16*len(ids)+16)
	for {
		var n C.size_t
		st := C.forge_detokenize(cm, p, C.size_t(len(ids)), 0, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		if st == C.FORGE_ERR_BUFFER_TOO_SMALL {
			buf = make([]byte, int(n)+1)
			continue
		}
		if st != C.FORGE_OK {
			return "", m.errorf(cm, st)
		}
		return string(buf[:int(n)]), nil
	}
}

// TokenID returns the id of a vocabulary entry or added token (exact text), or -1.
func (m *Model) TokenID(piece string) int32 {
	cm, err := m.acquire()
	if err != nil {
		return -1
	}
	defer m.release()
	var a cmem
	defer a.free()
	return int32(C.forge_token_id(cm, a.str(piece)))
}

// TokenPiece returns the vocabulary entry of token as stored ("▁the", "<0x0A>"); ok is false
// when token is out of range.
func (m *Model) TokenPiece(token int32) (piece string, ok bool) {
	cm, err := m.acquire()
	if err != nil {
		return "", false
	}
	defer m.release()
	p := C.forge_token_piece(cm, C.int32_t(token))
	if p == nil {
		return "", false
	}
	return C.GoString(p), true
}

// SpecialTokens returns the tokenizer's special ids.
func (m *Model) SpecialTokens() (SpecialTokens, error) {
	cm, err := m.acquire()
	if err != nil {
		return SpecialTokens{}, err
	}
	defer m.release()
	sp := C.forge_special_tokens{struct_size: C.sizeof_forge_special_tokens}
	if st := C.forge_model_special_tokens(cm, &sp); st != C.FORGE_OK {
		return SpecialTokens{}, m.errorf(cm, st)
	}
	out := SpecialTokens{BOS: int32(sp.bos), EOS: int32(sp.eos), EOT: int32(sp.eot), PAD: int32(sp.pad),
		UNK: int32(sp.unk), SOT: int32(sp.sot)}
	for i := 0; i < int(sp.n_eos) && i < len(sp.eos_ids); i++ {
		out.EOSIDs = append(out.EOSIDs, int32(sp.eos_ids[i]))
	}
	return out, nil
}

// RenderChat returns the conversation as the model's chat template renders it (the prompt
// Chat generates from). WithoutGenerationPrompt, WithThinking and WithTools apply. It fails
// with StatusUnsupported for a model without a known chat format (or, with tools, a family
// whose tools forge does not render) and StatusInvalidArgument when the template rejects the
// conversation.
func (m *Model) RenderChat(messages []Message, opts ...GenerateOption) (string, error) {
	cfg := NewGenerateConfig(opts...)
	if err := cfg.check(); err != nil {
		return "", err
	}
	cm, err := m.acquire()
	if err != nil {
		return "", err
	}
	defer m.release()
	var a cmem
	defer a.free()
	msgs, tools := a.messages(messages), a.tools(&cfg)
	size := 1024
	for _, msg := range messages {
		size += len(msg.Role) + len(msg.Content)
		for _, call := range msg.ToolCalls {
			size += 64 + 2*(len(call.Name)+len(call.Arguments))
		}
	}
	for i, t := range cfg.Tools {
		size += 256 + len(t.Name) + len(t.Description) + 4*len(cfg.toolParams[i])
	}
	for {
		buf := make([]byte, size)
		var n C.size_t
		st := C.forge_chat_render_tools(cm, msgs, C.int(len(messages)), tools, C.int(len(cfg.Tools)), cfg.chatFlags(),
			(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		if st == C.FORGE_ERR_BUFFER_TOO_SMALL {
			size = int(n) + 1
			continue
		}
		if st != C.FORGE_OK {
			return "", m.errorf(cm, st)
		}
		return string(buf[:int(n)]), nil
	}
}

func (a *cmem) messages(messages []Message) *C.forge_chat_message {
	if len(messages) == 0 {
		return nil
	}
	p := (*C.forge_chat_message)(a.alloc(uintptr(len(messages)) * C.sizeof_forge_chat_message))
	cs := unsafe.Slice(p, len(messages))
	for i, msg := range messages {
		cs[i].struct_size = C.sizeof_forge_chat_message
		cs[i].role = a.str(msg.Role)
		cs[i].content = a.str(msg.Content)
		if n := len(msg.ToolCalls); n > 0 {
			calls := (*C.forge_tool_call)(a.alloc(uintptr(n) * C.sizeof_forge_tool_call))
			for j, call := range msg.ToolCalls {
				c := &unsafe.Slice(calls, n)[j]
				c.struct_size = C.sizeof_forge_tool_call
				c.name = a.str(call.Name)
				if call.Arguments != "" {
					c.arguments = a.str(call.Arguments)
				}
				if call.ID != "" {
					c.id = a.str(call.ID)
				}
			}
			cs[i].tool_calls, cs[i].n_tool_calls = calls, C.int(n)
		}
		if msg.ToolCallID != "" {
			cs[i].tool_call_id = a.str(msg.ToolCallID)
		}
	}
	return p
}
