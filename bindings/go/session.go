package forge

/*
#include <stdint.h>
#include <stdlib.h>
#include "forge.h"

// Defined by callback.go's //export.
extern int goForgeToken(uintptr_t handle, int32_t token, char *text, size_t text_len);

static int forge_go_on_token(void *user_data, int32_t token, const char *text, size_t text_len) {
	return goForgeToken((uintptr_t)user_data, token, (char *)text, text_len);
}

// Points a generate call's token callback at Go; the handle is a runtime/cgo.Handle.
static void forge_go_set_callback(forge_generate_params *p, uintptr_t handle) {
	p->on_token = forge_go_on_token;
	p->user_data = (void *)handle;
}

// Defined by callback.go's //export.
extern void goForgePrewarm(uintptr_t handle, int done, int total, char *kernel);

static void forge_go_on_prewarm(void *user_data, int done, int total, const char *kernel) {
	goForgePrewarm((uintptr_t)user_data, done, total, (char *)kernel);
}

// forge_session_prewarm with its progress in Go; handle 0 (never a runtime/cgo.Handle): none.
static forge_status forge_go_prewarm(forge_session *s, int n_prompt, uintptr_t handle) {
	return forge_session_prewarm(s, n_prompt, handle ? forge_go_on_prewarm : NULL, (void *)handle);
}
*/
import "C"

import (
	"context"
	"fmt"
	"iter"
	"runtime/cgo"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// SessionConfig sets up a Session; a zero field takes the model's LoadOption value (and then
// forge's default).
type SessionConfig struct {
	ContextLen int      // tokens the KV cache holds
	BatchSize  int      // most tokens per prefill step
	Sequences  int      // sequences BatchGenerate decodes at once
	Overflow   Overflow // what a full context does
	Keep       int      // tokens a context slide never drops
	KVType     KVType   // the KV cache's type
}

// Session is one forge_session on a Model: a KV cache, scratch buffers and sampler, with an
// exact-prefix prompt cache across calls (a prompt that continues what the cache holds, such
// as a chat's next turn, prefills only the new tokens). It runs one call at a time: a call
// made while another runs (from another goroutine or from inside a range loop over its
// stream) fails with ErrBusy.
type Session struct {
	m       *Model
	c       *C.forge_session // nil once freed
	cancel  *C.int           // the calls' cancel flag, in C memory (C reads it atomically)
	busy    bool             // a call is running (guarded by m.mu, as the fields below)
	closed  bool
	lastErr error
	last    Metrics
}

// NewSession creates a session on the model. Close it when done (Model.Close closes it too).
func (m *Model) NewSession(cfg SessionConfig) (*Session, error) {
	pick := func(v, dflt int) int {
		if v != 0 {
			return v
		}
		return dflt
	}
	p := C.forge_session_default_params()
	p.n_ctx = C.int(pick(cfg.ContextLen, m.cfg.ContextLen))
	p.n_batch = C.int(pick(cfg.BatchSize, m.cfg.BatchSize))
	p.n_seq_max = C.int(pick(cfg.Sequences, 0))
	p.overflow = C.int(pick(int(cfg.Overflow), int(m.cfg.Overflow)))
	p.n_keep = C.int(pick(cfg.Keep, m.cfg.Keep))
	p.kv_type = C.int(pick(int(cfg.KVType), int(m.cfg.KVType)))
	cm, err := m.acquire()
	if err != nil {
		return nil, err
	}
	var cs *C.forge_session
	st := C.forge_session_create(cm, &p, &cs)
	if st != C.FORGE_OK {
		err := m.errorf(cm, st)
		m.release()
		return nil, err
	}
	s := &Session{m: m, c: cs, cancel: (*C.int)(C.calloc(1, C.sizeof_int))}
	m.mu.Lock()
	m.inflight--
	m.sessions[s] = struct{}{}
	if m.closed {
		s.closeLocked()
		m.mu.Unlock()
		return nil, ErrClosed
	}
	m.mu.Unlock()
	return s, nil
}

// Close frees the session; a call still running on it is cancelled (its Err is ErrClosed)
// and the session is freed when it returns. Closing twice is safe.
func (s *Session) Close() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.closeLocked()
	return nil
}

func (s *Session) closeLocked() {
	if s.closed {
		return
	}
	s.closed = true
	if s.busy {
		atomic.StoreInt32((*int32)(unsafe.Pointer(s.cancel)), 1)
		return // end() frees it
	}
	s.freeLocked()
}

func (s *Session) freeLocked() {
	if s.c == nil {
		return
	}
	C.forge_session_free(s.c)
	C.free(unsafe.Pointer(s.cancel))
	s.c, s.cancel = nil, nil
	delete(s.m.sessions, s)
	s.m.maybeFreeLocked()
}

// begin marks the session busy for one call and returns it.
func (s *Session) begin() (*C.forge_session, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.busy {
		return nil, ErrBusy
	}
	s.busy = true
	atomic.StoreInt32((*int32)(unsafe.Pointer(s.cancel)), 0)
	return s.c, nil
}

func (s *Session) end() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.busy = false
	if s.closed {
		s.freeLocked()
	}
}

func (s *Session) isClosed() bool {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.closed
}

// watch sets the cancel flag when ctx is done; the returned func stops watching (after it
// returns the flag is no longer written).
func (s *Session) watch(ctx context.Context) func() {
	if ctx.Done() == nil {
		return func() {}
	}
	flag := (*int32)(unsafe.Pointer(s.cancel))
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		atomic.StoreInt32(flag, 1)
		close(fired)
	})
	return func() {
		if !stop() {
			<-fired
		}
	}
}

// cancelled is the error of a call that forge stopped because the cancel flag was set.
func (s *Session) cancelled(ctx context.Context) error {
	if s.isClosed() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return &Error{Status: StatusCancelled, Message: "cancelled"}
}

func (s *Session) setResult(met Metrics, err error, setErr bool) {
	s.m.mu.Lock()
	s.last = met
	if setErr {
		s.lastErr = err
	}
	s.m.mu.Unlock()
}

// Err returns the error of the session's last Generate or Chat (see Model.Err).
func (s *Session) Err() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.lastErr
}

// Metrics returns the numbers of the session's last call (see Model.Metrics).
func (s *Session) Metrics() Metrics {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.last
}

func (a *cmem) generateParams(c *GenerateConfig) *C.forge_generate_params {
	p := (*C.forge_generate_params)(a.alloc(C.sizeof_forge_generate_params))
	*p = C.forge_generate_default_params()
	p.max_tokens = C.int(c.MaxTokens)
	p.temperature = C.float(c.Temperature)
	p.top_k = C.int(c.TopK)
	p.top_p = C.float(c.TopP)
	p.min_p = C.float(c.MinP)
	p.repeat_penalty = C.float(c.RepeatPenalty)
	p.repeat_window = C.int(c.RepeatWindow)
	p.seed = C.uint64_t(c.Seed)
	p.lookup = C.int(c.Lookup)
	if n := len(c.StopTokens); n > 0 {
		ids := (*C.int32_t)(a.alloc(uintptr(n) * 4))
		for i, id := range c.StopTokens {
			unsafe.Slice(ids, n)[i] = C.int32_t(id)
		}
		p.stop_tokens, p.n_stop_tokens = ids, C.int(n)
	}
	if n := len(c.StopStrings); n > 0 {
		strs := (**C.char)(a.alloc(uintptr(n) * unsafe.Sizeof((*C.char)(nil))))
		for i, str := range c.StopStrings {
			unsafe.Slice(strs, n)[i] = a.str(str)
		}
		p.stop_strings, p.n_stop_strings = strs, C.int(n)
	}
	p.ignore_eos = cbool(c.IgnoreEOS)
	p.add_special = cbool(c.AddSpecial)
	p.constraint = a.constraint(&c.Constraint)
	return p
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// stream hands the tokens of one generate or chat call to the range loop's yield.
type stream struct {
	yield    func(Token) bool
	stopped  bool // yield returned false (or panicked): never call it again
	panicked bool
	panicVal any
}

func (st *stream) onToken(id int32, text string) (ret C.int) {
	if st.stopped {
		return 1
	}
	if id < 0 && text == "" {
		return 0
	}
	// A panic in the loop body must not unwind through forge's C frames: keep it, stop
	// generation, and panic again once the C call has returned.
	defer func() {
		if r := recover(); r != nil {
			st.stopped, st.panicked, st.panicVal, ret = true, true, r, 1
		}
	}()
	if !st.yield(Token{ID: id, Text: text}) {
		st.stopped = true
		return 1
	}
	return 0
}

type generateCall func(cs *C.forge_session, a *cmem, cfg *GenerateConfig, p *C.forge_generate_params, met *C.forge_metrics) C.forge_status

// seq runs one generate or chat call per range over the returned sequence.
func (s *Session) seq(ctx context.Context, opts []GenerateOption, call generateCall) iter.Seq[Token] {
	return func(yield func(Token) bool) {
		cfg := NewGenerateConfig(opts...)
		st := &stream{yield: yield}
		met, err := s.run(ctx, &cfg, st, call)
		s.setResult(met, err, true)
		if st.panicked {
			panic(st.panicVal)
		}
	}
}

func (s *Session) run(ctx context.Context, cfg *GenerateConfig, st *stream, call generateCall) (Metrics, error) {
	if err := ctx.Err(); err != nil {
		return Metrics{StopReason: StopCancelled}, err
	}
	if err := cfg.check(); err != nil {
		return Metrics{}, err
	}
	cs, err := s.begin()
	if err != nil {
		return Metrics{}, err
	}
	defer s.end()
	var a cmem
	defer a.free()
	p := a.generateParams(cfg)
	if d := cfg.Draft; d == s {
		p.draft = cs // forge names the mistake
	} else if d != nil {
		ds, err := d.begin()
		if err != nil {
			return Metrics{}, fmt.Errorf("the draft session: %w", err)
		}
		defer d.end()
		p.draft = ds
	}
	h := cgo.NewHandle(tokenSink(st))
	defer h.Delete()
	C.forge_go_set_callback(p, C.uintptr_t(h))
	p.cancel = s.cancel
	cmet := (*C.forge_metrics)(a.alloc(C.sizeof_forge_metrics))
	cmet.struct_size = C.sizeof_forge_metrics
	stop := s.watch(ctx)
	status := call(cs, &a, cfg, p, cmet)
	stop()
	met := metrics(cmet)
	if status != C.FORGE_OK {
		return met, newError(status, C.forge_session_errmsg(cs))
	}
	if met.StopReason == StopCancelled {
		return met, s.cancelled(ctx)
	}
	return met, nil
}

// Generate streams the tokens generated from prompt; see Model.Generate. The session's cache
// afterwards holds the prompt and the generated tokens, so a later prompt that continues them
// prefills only the rest.
func (s *Session) Generate(ctx context.Context, prompt string, opts ...GenerateOption) iter.Seq[Token] {
	return s.seq(ctx, opts, func(cs *C.forge_session, a *cmem, _ *GenerateConfig, p *C.forge_generate_params, met *C.forge_metrics) C.forge_status {
		return C.forge_generate(cs, a.str(prompt), C.size_t(len(prompt)), p, met)
	})
}

// GenerateTokens is Generate from a prompt of token ids.
func (s *Session) GenerateTokens(ctx context.Context, prompt []int32, opts ...GenerateOption) iter.Seq[Token] {
	return s.seq(ctx, opts, func(cs *C.forge_session, a *cmem, _ *GenerateConfig, p *C.forge_generate_params, met *C.forge_metrics) C.forge_status {
		ids := (*C.int32_t)(a.alloc(uintptr(len(prompt)) * 4))
		for i, id := range prompt {
			unsafe.Slice(ids, len(prompt))[i] = C.int32_t(id)
		}
		return C.forge_generate_tokens(cs, ids, C.int(len(prompt)), p, met)
	})
}

// Chat streams the reply to messages; see Model.Chat. The prompt cache makes a multi-turn
// chat on one session prefill only the new turn.
func (s *Session) Chat(ctx context.Context, messages []Message, opts ...GenerateOption) iter.Seq[Token] {
	return s.seq(ctx, opts, func(cs *C.forge_session, a *cmem, cfg *GenerateConfig, p *C.forge_generate_params, met *C.forge_metrics) C.forge_status {
		return a.chat(cs, messages, cfg, p, nil, met)
	})
}

// Classify is Model.Classify on this session. The session's cache is scratch here: afterwards
// it holds no tokens.
func (s *Session) Classify(ctx context.Context, prompts []string, opts ...GenerateOption) ([]ClassifyResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(prompts) == 0 {
		return nil, nil
	}
	cfg := NewGenerateConfig(opts...)
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cs, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer s.end()
	n := len(prompts)
	var a cmem
	defer a.free()
	cp := (*C.forge_classify_prompt)(a.alloc(uintptr(n) * C.sizeof_forge_classify_prompt))
	for i, text := range prompts {
		q := &unsafe.Slice(cp, n)[i]
		q.struct_size = C.sizeof_forge_classify_prompt
		q.text, q.text_len = a.str(text), C.size_t(len(text))
	}
	par := (*C.forge_classify_params)(a.alloc(C.sizeof_forge_classify_params))
	*par = C.forge_classify_default_params()
	par.temperature, par.top_k = C.float(cfg.Temperature), C.int(cfg.TopK)
	par.top_p, par.min_p = C.float(cfg.TopP), C.float(cfg.MinP)
	par.seed, par.add_special = C.uint64_t(cfg.Seed), cbool(cfg.AddSpecial)
	par.cancel = s.cancel
	par.constraint = a.constraint(&cfg.Constraint)
	nv := s.m.info.VocabSize
	var logits *C.float
	if cfg.Logits {
		logits = (*C.float)(a.alloc(uintptr(n*nv) * 4))
		par.logits, par.logits_capacity = logits, C.size_t(n*nv)
	}
	res := (*C.forge_classify_result)(a.alloc(uintptr(n) * C.sizeof_forge_classify_result))
	res.struct_size = C.sizeof_forge_classify_result // the array's element size (forge.h)
	stop := s.watch(ctx)
	status := C.forge_classify(cs, cp, C.int(n), par, res)
	stop()
	cmet := C.forge_metrics{struct_size: C.sizeof_forge_metrics}
	if C.forge_session_metrics(cs, &cmet) == C.FORGE_OK {
		s.setResult(metrics(&cmet), nil, false)
	}
	if status == C.FORGE_ERR_CANCELLED {
		return nil, s.cancelled(ctx)
	}
	if status != C.FORGE_OK {
		return nil, newError(status, C.forge_session_errmsg(cs))
	}
	out := make([]ClassifyResult, n)
	for i, r := range unsafe.Slice(res, n) {
		out[i] = ClassifyResult{Token: Token{ID: int32(r.token)}, NumTokens: int(r.n_tokens), Choice: int(r.choice)}
		if r.text != nil {
			out[i].Token.Text = C.GoStringN(r.text, C.int(r.text_len))
		}
		if logits != nil {
			row := unsafe.Slice((*float32)(unsafe.Pointer(logits)), n*nv)[i*nv : (i+1)*nv]
			out[i].Logits = append([]float32(nil), row...)
		}
	}
	return out, nil
}

// batchSink collects one BatchGenerate item's tokens.
type batchSink struct{ tokens []Token }

func (b *batchSink) onToken(id int32, text string) C.int {
	if id >= 0 || text != "" {
		b.tokens = append(b.tokens, Token{ID: id, Text: text})
	}
	return 0
}

// BatchGenerate is Model.BatchGenerate on this session, which decodes up to its
// SessionConfig.Sequences prompts at once. The session's cache is scratch here: afterwards it
// holds no tokens.
func (s *Session) BatchGenerate(ctx context.Context, prompts []string, opts ...GenerateOption) ([]BatchResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(prompts) == 0 {
		return nil, nil
	}
	cfg := NewGenerateConfig(opts...)
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cs, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer s.end()
	n := len(prompts)
	var a cmem
	defer a.free()
	items := (*C.forge_batch_item)(a.alloc(uintptr(n) * C.sizeof_forge_batch_item))
	sinks := make([]*batchSink, n)
	for i, text := range prompts {
		p := a.generateParams(&cfg)
		sinks[i] = &batchSink{}
		h := cgo.NewHandle(tokenSink(sinks[i]))
		defer h.Delete()
		C.forge_go_set_callback(p, C.uintptr_t(h))
		p.cancel = s.cancel
		it := &unsafe.Slice(items, n)[i]
		it.struct_size = C.sizeof_forge_batch_item
		it.text, it.text_len, it.params = a.str(text), C.size_t(len(text)), p
	}
	results := (*C.forge_batch_result)(a.alloc(uintptr(n) * C.sizeof_forge_batch_result))
	results.struct_size = C.sizeof_forge_batch_result // the array's element size (forge.h)
	start := time.Now()
	stop := s.watch(ctx)
	status := C.forge_batch_generate(cs, items, C.int(n), results)
	stop()
	wall := time.Since(start)
	if status != C.FORGE_OK {
		return nil, newError(status, C.forge_session_errmsg(cs))
	}
	rs := unsafe.Slice(results, n)
	lastFailed := -1
	for i := range rs {
		if rs[i].status != C.FORGE_OK {
			lastFailed = i
		}
	}
	out := make([]BatchResult, n)
	var total Metrics
	cancelled := false
	for i := range rs {
		if rs[i].status != C.FORGE_OK {
			// forge keeps the message of the last failed item only, on the session.
			e := &Error{Status: Status(rs[i].status), Message: "prompt failed"}
			if i == lastFailed {
				e.Message = C.GoString(C.forge_session_errmsg(cs))
			}
			out[i].Err = e
			continue
		}
		met := metrics(&rs[i].metrics)
		var text strings.Builder
		for _, t := range sinks[i].tokens {
			text.WriteString(t.Text)
		}
		out[i] = BatchResult{Tokens: sinks[i].tokens, Text: text.String(), Metrics: met}
		total.PromptTokens += met.PromptTokens
		total.CachedTokens += met.CachedTokens
		total.GeneratedTokens += met.GeneratedTokens
		total.PrefillDuration += met.PrefillDuration
		total.PeakMemoryBytes = max(total.PeakMemoryBytes, met.PeakMemoryBytes)
		total.ForcedTokens += met.ForcedTokens
		total.ConstraintMasks += met.ConstraintMasks
		total.ConstraintDuration += met.ConstraintDuration
		if met.StopReason == StopCancelled {
			cancelled = true
		}
	}
	total.DecodeDuration = wall - total.PrefillDuration
	if wall > 0 {
		total.DecodeTokensPerSec = float64(total.GeneratedTokens) / wall.Seconds()
	}
	if total.PrefillDuration > 0 {
		total.PrefillTokensPerSec = float64(total.PromptTokens-total.CachedTokens) / total.PrefillDuration.Seconds()
	}
	if cancelled {
		total.StopReason = StopCancelled
	}
	s.setResult(total, nil, false)
	if cancelled {
		return out, s.cancelled(ctx)
	}
	return out, nil
}

// NPast returns the tokens the session's cache holds (0 when closed or busy).
func (s *Session) NPast() int {
	cs, err := s.begin()
	if err != nil {
		return 0
	}
	defer s.end()
	return int(C.forge_session_n_past(cs))
}

// KVType returns the type the session's KV cache holds, KVF32, KVF16 or KVQ8_0 (KVDefault resolved;
// KVDefault when closed or busy).
func (s *Session) KVType() KVType {
	cs, err := s.begin()
	if err != nil {
		return KVDefault
	}
	defer s.end()
	return KVType(C.forge_session_kv_type(cs))
}

// prewarmSink hands Prewarm's progress to its func.
type prewarmSink struct {
	progress func(done, total int, kernel string)
	panicked bool // progress panicked: never call it again
	panicVal any
}

func (p *prewarmSink) onKernel(done, total int, kernel string) {
	if p.panicked {
		return
	}
	// A panic in progress must not unwind through forge's C frames: keep it and panic again
	// once the C call has returned.
	defer func() {
		if r := recover(); r != nil {
			p.panicked, p.panicVal = true, r
		}
	}()
	p.progress(done, total, kernel)
}

// Prewarm compiles, before the first call, the kernels the session's first calls run
// (forge_session_prewarm): a prompt step of nPrompt tokens (0, or more than the batch size: the
// batch size; 1: a one-token prompt) and a generation step, so that the first prompt does not
// wait for the driver's compiler (lavapipe compiles each kernel when first dispatched, up to
// seconds each while Mesa's shader cache is cold). Run at install time, it fills the driver's
// disk cache so a user's first run starts warm. progress (nil: none) is called before each
// kernel with (done, total, its name) and once at the end with (total, total, ""). Kernels the
// model has already prewarmed (on any of its sessions) are not counted: a second call reports
// only (0, 0, ""). A panic in progress stops the calls to it (the kernels are still compiled)
// and is raised again once the C call has returned. nPrompt < 0 fails with
// StatusInvalidArgument, a driver failure with StatusDevice.
func (s *Session) Prewarm(nPrompt int, progress func(done, total int, kernel string)) error {
	cs, err := s.begin()
	if err != nil {
		return err
	}
	defer s.end()
	sink := &prewarmSink{progress: progress}
	var h cgo.Handle
	if progress != nil {
		h = cgo.NewHandle(sink)
		defer h.Delete()
	}
	status := C.forge_go_prewarm(cs, C.int(nPrompt), C.uintptr_t(h))
	if sink.panicked {
		panic(sink.panicVal)
	}
	return newError(status, C.forge_session_errmsg(cs))
}

// Truncate forgets all but the first keep cached tokens (0: a fresh sequence).
func (s *Session) Truncate(keep int) error {
	cs, err := s.begin()
	if err != nil {
		return err
	}
	defer s.end()
	return newError(C.forge_session_truncate(cs, C.int(keep)), C.forge_session_errmsg(cs))
}

// Save writes the session's tokens and KV cache to a state file (atomically).
func (s *Session) Save(path string) error {
	cs, err := s.begin()
	if err != nil {
		return err
	}
	defer s.end()
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	return newError(C.forge_session_save(cs, cp), C.forge_session_errmsg(cs))
}

// Load replaces the session's state with a file Save wrote for the same model.
func (s *Session) Load(path string) error {
	cs, err := s.begin()
	if err != nil {
		return err
	}
	defer s.end()
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	return newError(C.forge_session_load(cs, cp), C.forge_session_errmsg(cs))
}

// Memory returns the session's host and device memory (its KV cache included).
func (s *Session) Memory() (MemoryStats, error) {
	cs, err := s.begin()
	if err != nil {
		return MemoryStats{}, err
	}
	defer s.end()
	st := C.forge_memory_stats{struct_size: C.sizeof_forge_memory_stats}
	if status := C.forge_session_memory(cs, &st); status != C.FORGE_OK {
		return MemoryStats{}, newError(status, C.forge_session_errmsg(cs))
	}
	return memoryStats(&st), nil
}
