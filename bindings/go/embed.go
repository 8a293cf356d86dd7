package forge

/*
#include <stdlib.h>
#include "forge.h"
*/
import "C"

import (
	"context"
	"strings"
	"unsafe"
)

// Pooling is forge_pooling: how Embed turns a text's hidden states into one vector.
type Pooling int

// The forge_pooling values of forge.h.
const (
	PoolingDefault Pooling = 0 // the checkpoint's Pooling module; without one, the last token
	PoolingLast    Pooling = 1 // the last token's hidden state (after the final norm)
	PoolingMean    Pooling = 2 // the mean over every token of the text (prompt included)
	PoolingCLS     Pooling = 3 // the first token's
)

var poolingNames = [...]string{"default", "last", "mean", "cls"}

// String returns the pooling's lower-case name ("last", "mean", "cls").
func (p Pooling) String() string {
	if p >= 0 && int(p) < len(poolingNames) {
		return poolingNames[p]
	}
	return "unknown"
}

// EmbedInfo is forge_embed_info: what Embed does with a model.
type EmbedInfo struct {
	Dim                  int      // the vector's length before truncation (the last Dense's output, else the hidden size)
	Pooling              Pooling  // the checkpoint's pooling (never PoolingDefault)
	Normalize            bool     // the checkpoint ends in Normalize: vectors are unit length
	MaxTokens            int      // the longest text embedded whole (max_seq_length, else the context)
	NumDense             int      // Dense projections after pooling
	Bidirectional        bool     // attention sees both sides (EmbeddingGemma): embedding only
	SentenceTransformers bool     // the checkpoint's modules.json was read
	PromptNames          []string // config_sentence_transformers.json's prompts ("query", "document", ...)
	DefaultPromptName    string   // the prompt used when none is named; "": none
}

// EmbedConfig holds what the embedding and reranking options set; NewEmbedConfig gives
// forge's defaults (forge_embed_default_params, forge_rerank_default_params).
type EmbedConfig struct {
	Pooling    Pooling // PoolingDefault: the checkpoint's
	Normalize  int     // -1: as the checkpoint declares (before truncation); 0: never; 1: L2-normalize the vector returned (after truncation)
	Dim        int     // Matryoshka: keep the first Dim values; 0: all
	PromptName string  // a prompt of config_sentence_transformers.json put before each text; "": its default_prompt_name, or none
	Prompt     *string // the prefix text itself (wins over PromptName; "" for none); nil: not given
	Truncate   bool    // a text (Rerank: a pair) over the model's limit is cut as sentence-transformers cuts it; false: StatusLimit
	AddSpecial bool    // the tokenizer's special tokens on each text (forge's default: true)

	Instruction string // Rerank: Qwen3-Reranker's <Instruct>; "": its default
	RawScores   bool   // Rerank: the logit instead of the probability
}

// NewEmbedConfig returns forge's defaults with opts applied.
func NewEmbedConfig(opts ...EmbedOption) EmbedConfig {
	d := C.forge_embed_default_params()
	r := C.forge_rerank_default_params()
	c := EmbedConfig{
		Pooling:    Pooling(d.pooling),
		Normalize:  int(d.normalize),
		Dim:        int(d.dim),
		Truncate:   d.truncate != 0 && r.truncate != 0,
		AddSpecial: d.add_special != 0,
		RawScores:  r.raw != 0,
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// EmbedOption sets an EmbedConfig field (functional options, as GenerateOption).
type EmbedOption func(*EmbedConfig)

// WithPooling overrides the checkpoint's pooling.
func WithPooling(p Pooling) EmbedOption { return func(c *EmbedConfig) { c.Pooling = p } }

// WithNormalize sets whether vectors are L2-normalized: true normalizes the vector returned
// (after WithDim's truncation), false never normalizes. Without it a checkpoint's Normalize
// module applies, before truncation, as sentence-transformers does.
func WithNormalize(on bool) EmbedOption {
	return func(c *EmbedConfig) {
		c.Normalize = 0
		if on {
			c.Normalize = 1
		}
	}
}

// WithDim keeps the first n values of each vector (Matryoshka truncation; sentence-transformers'
// truncate_dim).
func WithDim(n int) EmbedOption { return func(c *EmbedConfig) { c.Dim = n } }

// WithPromptName puts a prompt of the checkpoint's config_sentence_transformers.json ("query",
// "document", ...) before each text. A name it lacks fails the call with StatusInvalidArgument
// naming the ones it has.
func WithPromptName(name string) EmbedOption { return func(c *EmbedConfig) { c.PromptName = name } }

// WithPrompt puts text before each text (it wins over WithPromptName; "" for no prefix, not
// even the checkpoint's default prompt).
func WithPrompt(text string) EmbedOption { return func(c *EmbedConfig) { c.Prompt = &text } }

// WithTruncate sets whether a text longer than the model's limit (Embed), or a query and
// document pair longer than the context (Rerank), is truncated as sentence-transformers does
// (the default) or fails the call with StatusLimit.
func WithTruncate(on bool) EmbedOption { return func(c *EmbedConfig) { c.Truncate = on } }

// WithInstruction sets Qwen3-Reranker's <Instruct> text for Rerank.
func WithInstruction(text string) EmbedOption { return func(c *EmbedConfig) { c.Instruction = text } }

// WithRawScores makes Rerank return logits (the head's, or log P(yes) - log P(no)) instead of
// probabilities.
func WithRawScores() EmbedOption { return func(c *EmbedConfig) { c.RawScores = true } }

// EmbedInfo returns what Embed does with the model. The first call reads the checkpoint's
// sentence-transformers files; their errors are returned here and by Embed.
func (m *Model) EmbedInfo() (EmbedInfo, error) {
	cm, err := m.acquire()
	if err != nil {
		return EmbedInfo{}, err
	}
	defer m.release()
	info := C.forge_embed_info{struct_size: C.sizeof_forge_embed_info}
	if st := C.forge_embed_info_get(cm, &info); st != C.FORGE_OK {
		return EmbedInfo{}, m.errorf(cm, st)
	}
	out := EmbedInfo{
		Dim: int(info.dim), Pooling: Pooling(info.pooling), Normalize: info.normalize != 0,
		MaxTokens: int(info.max_tokens), NumDense: int(info.n_dense), Bidirectional: info.bidirectional != 0,
		SentenceTransformers: info.sentence_transformers != 0,
	}
	if names := C.GoString(info.prompt_names); names != "" {
		out.PromptNames = strings.Split(names, ",")
	}
	if info.default_prompt_name != nil {
		out.DefaultPromptName = C.GoString(info.default_prompt_name)
	}
	return out, nil
}

// Embed turns texts into vectors as sentence-transformers' encode() does, reading the
// checkpoint's sentence-transformers files (modules.json, pooling, Dense, Normalize, prompts,
// max_seq_length) when it has them; any other decoder forge loads is pooled as WithPooling says
// (the last token by default). Texts are batched as Classify batches prompts, and each vector
// is the same whatever the batch. The vectors are Dim long (WithDim, else EmbedInfo().Dim).
func (m *Model) Embed(ctx context.Context, texts []string, opts ...EmbedOption) ([][]float32, error) {
	s, err := m.takeSession(false)
	if err != nil {
		return nil, err
	}
	defer m.putSession(s, false)
	res, err := s.Embed(ctx, texts, opts...)
	m.setResult(s.Metrics(), nil, false)
	return res, err
}

// Rerank scores each document against query, higher for more relevant: a
// sequence-classification checkpoint (a `score` head) scores the pair as
// sentence-transformers' CrossEncoder.predict does (the logit through a sigmoid), a causal LM
// with "yes" and "no" tokens as Qwen3-Reranker's model card prompts it (P("yes")). Options:
// WithInstruction, WithRawScores, WithTruncate. A model with neither formulation fails with
// StatusUnsupported saying what it lacks.
func (m *Model) Rerank(ctx context.Context, query string, documents []string, opts ...EmbedOption) ([]float32, error) {
	s, err := m.takeSession(false)
	if err != nil {
		return nil, err
	}
	defer m.putSession(s, false)
	res, err := s.Rerank(ctx, query, documents, opts...)
	m.setResult(s.Metrics(), nil, false)
	return res, err
}

// finish records the call's metrics and turns its status into the call's error.
func (s *Session) finish(ctx context.Context, cs *C.forge_session, status C.forge_status) error {
	cmet := C.forge_metrics{struct_size: C.sizeof_forge_metrics}
	if C.forge_session_metrics(cs, &cmet) == C.FORGE_OK {
		s.setResult(metrics(&cmet), nil, false)
	}
	if status == C.FORGE_ERR_CANCELLED {
		return s.cancelled(ctx)
	}
	return newError(status, C.forge_session_errmsg(cs))
}

// Embed is Model.Embed on this session. The session's cache is scratch here: afterwards it
// holds no tokens.
func (s *Session) Embed(ctx context.Context, texts []string, opts ...EmbedOption) ([][]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(texts) == 0 {
		return nil, nil
	}
	cfg := NewEmbedConfig(opts...)
	cs, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer s.end()
	n := len(texts)
	var a cmem
	defer a.free()
	cp := (*C.forge_classify_prompt)(a.alloc(uintptr(n) * C.sizeof_forge_classify_prompt))
	for i, text := range texts {
		q := &unsafe.Slice(cp, n)[i]
		q.struct_size = C.sizeof_forge_classify_prompt
		q.text, q.text_len = a.str(text), C.size_t(len(text))
	}
	par := (*C.forge_embed_params)(a.alloc(C.sizeof_forge_embed_params))
	*par = C.forge_embed_default_params()
	par.pooling, par.normalize, par.dim = C.int(cfg.Pooling), C.int(cfg.Normalize), C.int(cfg.Dim)
	if cfg.PromptName != "" {
		par.prompt_name = a.str(cfg.PromptName)
	}
	if cfg.Prompt != nil {
		par.prompt = a.str(*cfg.Prompt)
	}
	par.truncate, par.add_special = cbool(cfg.Truncate), cbool(cfg.AddSpecial)
	par.cancel = s.cancel
	// The vector's length: forge writes it when asked for no vectors (capacity 0).
	var dim C.int
	status := C.forge_embed(cs, cp, C.int(n), par, nil, 0, &dim)
	if status != C.FORGE_OK && status != C.FORGE_ERR_BUFFER_TOO_SMALL {
		return nil, s.finish(ctx, cs, status)
	}
	d := int(dim)
	flat := make([]float32, n*d+1) // Go memory holding no pointers, written by forge
	stop := s.watch(ctx)
	status = C.forge_embed(cs, cp, C.int(n), par, (*C.float)(unsafe.Pointer(&flat[0])), C.size_t(n*d), &dim)
	stop()
	if err := s.finish(ctx, cs, status); err != nil {
		return nil, err
	}
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*d : (i+1)*d : (i+1)*d]
	}
	return out, nil
}

// Rerank is Model.Rerank on this session. The session's cache is scratch here: afterwards it
// holds no tokens.
func (s *Session) Rerank(ctx context.Context, query string, documents []string, opts ...EmbedOption) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(documents) == 0 {
		return nil, nil
	}
	cfg := NewEmbedConfig(opts...)
	cs, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer s.end()
	n := len(documents)
	var a cmem
	defer a.free()
	docs := (**C.char)(a.alloc(uintptr(n) * unsafe.Sizeof((*C.char)(nil))))
	for i, doc := range documents {
		unsafe.Slice(docs, n)[i] = a.str(doc)
	}
	par := (*C.forge_rerank_params)(a.alloc(C.sizeof_forge_rerank_params))
	*par = C.forge_rerank_default_params()
	if cfg.Instruction != "" {
		par.instruction = a.str(cfg.Instruction)
	}
	par.raw, par.truncate = cbool(cfg.RawScores), cbool(cfg.Truncate)
	par.cancel = s.cancel
	scores := make([]float32, n)
	stop := s.watch(ctx)
	status := C.forge_rerank(cs, a.str(query), docs, C.int(n), par, (*C.float)(unsafe.Pointer(&scores[0])))
	stop()
	if err := s.finish(ctx, cs, status); err != nil {
		return nil, err
	}
	return scores, nil
}
