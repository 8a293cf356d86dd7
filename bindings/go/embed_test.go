package forge_test

// Tests of Embed, Rerank and EmbedInfo on the committed fixtures (tests/fixtures/embed: tiny
// random-weight checkpoints laid out as sentence-transformers publishes them, with
// sentence-transformers' own vectors and scores in reference.json; made by
// tools/fixtures/make_embed_fixtures.py).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	forge "forge.lthn.ai/core/forge/bindings/go"
)

const embedTol = 1e-4 // absolute, on every value of every vector and score

var embedFixtures = filepath.Join(root, "tests", "fixtures", "embed")

type embedCase struct {
	PromptName  *string     `json:"prompt_name"`
	Prompt      *string     `json:"prompt"`
	TruncateDim int         `json:"truncate_dim"`
	IDs         [][]int32   `json:"ids"`
	Vectors     [][]float64 `json:"vectors"`
}

type embedReference struct {
	Texts []string    `json:"texts"`
	Cases []embedCase `json:"cases"`
}

type rerankReference struct {
	Query     string   `json:"query"`
	Documents []string `json:"documents"`
	Cases     []struct {
		Instruction *string   `json:"instruction"`
		Scores      []float64 `json:"scores"`
	} `json:"cases"`
	Scores []float64 `json:"scores"` // the cross-encoder's
	Logits []float64 `json:"logits"`
}

func readReference(t *testing.T, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(embedFixtures, name, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func loadFixture(t *testing.T, name string) *forge.Model {
	t.Helper()
	m, err := forge.LoadModel(filepath.Join(embedFixtures, name))
	if err != nil {
		t.Fatalf("LoadModel %s: %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// options returns a reference case's sentence-transformers options as EmbedOptions.
func (c embedCase) options() []forge.EmbedOption {
	var opts []forge.EmbedOption
	if c.PromptName != nil {
		opts = append(opts, forge.WithPromptName(*c.PromptName))
	}
	if c.Prompt != nil {
		opts = append(opts, forge.WithPrompt(*c.Prompt))
	}
	if c.TruncateDim != 0 {
		opts = append(opts, forge.WithDim(c.TruncateDim))
	}
	return opts
}

func (c embedCase) String() string {
	switch {
	case c.PromptName != nil:
		return "prompt_name=" + *c.PromptName
	case c.Prompt != nil:
		return fmt.Sprintf("prompt=%q", *c.Prompt)
	case c.TruncateDim != 0:
		return fmt.Sprintf("truncate_dim=%d", c.TruncateDim)
	}
	return "no options"
}

// worst returns the largest absolute difference between two lists of vectors (+Inf when their
// shapes differ).
func worst[A, B float32 | float64](got [][]A, want [][]B) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range got {
		if len(got[i]) != len(want[i]) {
			return math.Inf(1)
		}
		for j := range got[i] {
			d = max(d, math.Abs(float64(got[i][j])-float64(want[i][j])))
		}
	}
	return d
}

func worstScore[A, B float32 | float64](got []A, want []B) float64 {
	return worst([][]A{got}, [][]B{want})
}

func reversed(s []string) []string {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

func norm(v []float32) float64 {
	s := 0.0
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// Every case of reference.json: no options, prompt names "query" and "document", a prompt of
// our own, truncate_dim 16 (WithDim(16), the Normalize module applied before the cut).
func TestEmbedIsSentenceTransformers(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"qwen3_embed_f32", "gemma3_embed_f32"} {
		t.Run(name, func(t *testing.T) {
			var ref embedReference
			readReference(t, name, &ref)
			m := loadFixture(t, name)
			for _, c := range ref.Cases {
				got, err := m.Embed(ctx, ref.Texts, c.options()...)
				if err != nil {
					t.Fatalf("%v: %v", c, err)
				}
				if d := worst(got, c.Vectors); d > embedTol {
					t.Errorf("%v: vectors differ from sentence-transformers' by %g", c, d)
				}
			}
		})
	}
}

func TestEmbedInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		want forge.EmbedInfo
	}{
		{"qwen3_embed_f32", forge.EmbedInfo{Dim: 64, Pooling: forge.PoolingLast, Normalize: true, SentenceTransformers: true}},
		{"gemma3_embed_f32", forge.EmbedInfo{Dim: 64, Pooling: forge.PoolingMean, Normalize: true, MaxTokens: 32, NumDense: 2,
			Bidirectional: true, SentenceTransformers: true}},
	} {
		info, err := loadFixture(t, tc.name).EmbedInfo()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if info.MaxTokens <= 0 {
			t.Errorf("%s: MaxTokens %d", tc.name, info.MaxTokens)
		}
		if tc.want.MaxTokens == 0 {
			tc.want.MaxTokens = info.MaxTokens // the context or max_seq_length, whichever is smaller
		}
		names := slices.Sorted(slices.Values(info.PromptNames))
		info.PromptNames = nil
		if !reflect.DeepEqual(info, tc.want) {
			t.Errorf("%s: EmbedInfo %+v, want %+v", tc.name, info, tc.want)
		}
		if !slices.Equal(names, []string{"document", "query"}) {
			t.Errorf("%s: PromptNames %q", tc.name, names)
		}
	}
	if forge.PoolingMean.String() != "mean" {
		t.Errorf("PoolingMean.String() = %q", forge.PoolingMean.String())
	}
}

// Reversing the texts, or embedding one at a time on a Session, changes no vector.
func TestEmbedOrderAndBatching(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"qwen3_embed_f32", "gemma3_embed_f32"} {
		var ref embedReference
		readReference(t, name, &ref)
		m := loadFixture(t, name)
		s, err := m.NewSession(forge.SessionConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		forward, err := s.Embed(ctx, ref.Texts, forge.WithPromptName("query"))
		if err != nil {
			t.Fatal(err)
		}
		backward, err := s.Embed(ctx, reversed(ref.Texts), forge.WithPromptName("query"))
		if err != nil {
			t.Fatal(err)
		}
		slices.Reverse(backward)
		if d := worst(backward, forward); d > 1e-5 {
			t.Errorf("%s: reversed texts' vectors differ by %g", name, d)
		}
		for i, text := range ref.Texts[:3] {
			alone, err := s.Embed(ctx, []string{text}, forge.WithPromptName("query"))
			if err != nil {
				t.Fatal(err)
			}
			if d := worst(alone, forward[i:i+1]); d > 1e-5 {
				t.Errorf("%s: text %d alone differs by %g", name, i, d)
			}
		}
		if d := worst(forward, ref.Cases[1].Vectors); d > embedTol {
			t.Errorf("%s: Session.Embed differs from sentence-transformers' by %g", name, d)
		}
	}
}

func TestEmbedOptions(t *testing.T) {
	ctx := context.Background()
	var ref embedReference
	readReference(t, "qwen3_embed_f32", &ref)
	want := ref.Cases[0].Vectors
	m := loadFixture(t, "qwen3_embed_f32")
	// WithNormalize(false): the pooled state, the Normalize module skipped.
	raw, err := m.Embed(ctx, ref.Texts, forge.WithNormalize(false))
	if err != nil {
		t.Fatal(err)
	}
	unit := make([][]float64, len(raw))
	for i, v := range raw {
		n := norm(v)
		for _, x := range v {
			unit[i] = append(unit[i], float64(x)/n)
		}
	}
	if d := worst(unit, want); d > embedTol || math.Abs(norm(raw[1])-1) < 1e-3 {
		t.Errorf("WithNormalize(false): normalized vectors differ by %g, |v| = %g", d, norm(raw[1]))
	}
	// WithNormalize(true) after WithDim: unit vectors along sentence-transformers' first 16.
	cut, err := m.Embed(ctx, ref.Texts, forge.WithDim(16), forge.WithNormalize(true))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range cut {
		n := math.Sqrt(func() (s float64) {
			for _, x := range want[i][:16] {
				s += x * x
			}
			return
		}())
		for j := range v {
			if d := math.Abs(float64(v[j]) - want[i][j]/n); d > embedTol {
				t.Fatalf("WithDim(16), WithNormalize(true): text %d value %d differs by %g", i, j, d)
			}
		}
	}
	// The checkpoint pools the last token: PoolingLast changes nothing, PoolingMean does.
	last, err := m.Embed(ctx, ref.Texts, forge.WithPooling(forge.PoolingLast))
	if err != nil {
		t.Fatal(err)
	}
	if d := worst(last, want); d > embedTol {
		t.Errorf("PoolingLast differs by %g", d)
	}
	mean, err := m.Embed(ctx, ref.Texts, forge.WithPooling(forge.PoolingMean))
	if err != nil {
		t.Fatal(err)
	}
	if d := worst(mean[1:], want[1:]); d < 1e-2 || len(mean[0]) != 64 {
		t.Errorf("PoolingMean: differs from the last token's by only %g", d)
	}
	// WithPrompt("") is no prefix, whatever the prompt name.
	none, err := m.Embed(ctx, ref.Texts, forge.WithPromptName("query"), forge.WithPrompt(""))
	if err != nil {
		t.Fatal(err)
	}
	if d := worst(none, want); d > embedTol {
		t.Errorf(`WithPrompt(""): differs by %g`, d)
	}
	if got, err := m.Embed(ctx, nil); got != nil || err != nil {
		t.Errorf("Embed(nil) = %v, %v", got, err)
	}
}

func TestEmbedErrors(t *testing.T) {
	ctx := context.Background()
	var ref embedReference
	readReference(t, "gemma3_embed_f32", &ref)
	m := loadFixture(t, "gemma3_embed_f32")
	_, err := m.Embed(ctx, []string{"hello"}, forge.WithPromptName("no_such_prompt"))
	var fe *forge.Error
	if !errors.As(err, &fe) || fe.Status != forge.StatusInvalidArgument ||
		!strings.Contains(fe.Message, "no_such_prompt") || !strings.Contains(fe.Message, "query") {
		t.Errorf("an unknown prompt name: %v, want StatusInvalidArgument naming it and the ones the model has", err)
	}
	// texts[4] is longer than max_seq_length (32 tokens): cut unless WithTruncate(false).
	if _, err := m.Embed(ctx, ref.Texts[4:5], forge.WithTruncate(false)); !errors.Is(err, forge.StatusLimit) {
		t.Errorf("WithTruncate(false) on a long text: %v, want StatusLimit", err)
	}
	if _, err := m.Embed(ctx, []string{"hello"}, forge.WithTruncate(false)); err != nil {
		t.Errorf("WithTruncate(false) on a short text: %v", err)
	}
	for _, dim := range []int{-1, 65} {
		if _, err := m.Embed(ctx, []string{"hello"}, forge.WithDim(dim)); !errors.Is(err, forge.StatusInvalidArgument) {
			t.Errorf("WithDim(%d): %v, want StatusInvalidArgument", dim, err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Embed(cancelled, ref.Texts); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled context: %v", err)
	}
	// The model still embeds after the errors.
	got, err := m.Embed(ctx, ref.Texts[:2])
	if err != nil || worst(got, ref.Cases[0].Vectors[:2]) > embedTol {
		t.Errorf("after the errors: %v", err)
	}
	if _, err := m.Rerank(ctx, "query", []string{"a document"}); !errors.Is(err, forge.StatusUnsupported) {
		t.Errorf("Rerank on an embedding model: %v, want StatusUnsupported", err)
	}
	m.Close()
	if _, err := m.Embed(ctx, []string{"hello"}); !errors.Is(err, forge.ErrClosed) {
		t.Errorf("Embed on a closed model: %v", err)
	}
	if _, err := m.EmbedInfo(); !errors.Is(err, forge.ErrClosed) {
		t.Errorf("EmbedInfo on a closed model: %v", err)
	}
}

// Qwen3-Reranker's formulation, as its model card computes it, with its default instruction
// and another; WithRawScores gives log P(yes) - log P(no).
func TestRerankIsQwen3RerankersModelCard(t *testing.T) {
	ctx := context.Background()
	var ref rerankReference
	readReference(t, "qwen3_rerank_f32", &ref)
	m := loadFixture(t, "qwen3_rerank_f32")
	for _, c := range ref.Cases {
		var opts []forge.EmbedOption
		if c.Instruction != nil {
			opts = append(opts, forge.WithInstruction(*c.Instruction))
		}
		scores, err := m.Rerank(ctx, ref.Query, ref.Documents, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if d := worstScore(scores, c.Scores); d > embedTol {
			t.Errorf("instruction %v: scores %v differ from the model card's %v by %g", c.Instruction, scores, c.Scores, d)
		}
		raw, err := m.Rerank(ctx, ref.Query, ref.Documents, append(opts, forge.WithRawScores())...)
		if err != nil {
			t.Fatal(err)
		}
		logits := make([]float64, len(c.Scores))
		for i, p := range c.Scores {
			logits[i] = math.Log(p) - math.Log1p(-p)
		}
		if d := worstScore(raw, logits); d > 1e-3 {
			t.Errorf("instruction %v: raw scores %v, want %v", c.Instruction, raw, logits)
		}
	}
	s, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	backward, err := s.Rerank(ctx, ref.Query, reversed(ref.Documents))
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(backward)
	if d := worstScore(backward, ref.Cases[0].Scores); d > embedTol {
		t.Errorf("reversed documents: scores differ by %g", d)
	}
	if got, err := s.Rerank(ctx, ref.Query, nil); got != nil || err != nil {
		t.Errorf("Rerank of no documents = %v, %v", got, err)
	}
}

// A sequence-classification head scored as sentence-transformers' CrossEncoder.predict does.
func TestRerankCrossEncoder(t *testing.T) {
	ctx := context.Background()
	var ref rerankReference
	readReference(t, "qwen3_cross_f32", &ref)
	m := loadFixture(t, "qwen3_cross_f32")
	scores, err := m.Rerank(ctx, ref.Query, ref.Documents)
	if err != nil {
		t.Fatal(err)
	}
	if d := worstScore(scores, ref.Scores); d > embedTol {
		t.Errorf("scores %v differ from CrossEncoder's %v by %g", scores, ref.Scores, d)
	}
	raw, err := m.Rerank(ctx, ref.Query, ref.Documents, forge.WithRawScores())
	if err != nil {
		t.Fatal(err)
	}
	if d := worstScore(raw, ref.Logits); d > embedTol {
		t.Errorf("raw scores %v differ from CrossEncoder's logits %v by %g", raw, ref.Logits, d)
	}
}

// Embeddings and reranking on the fixtures. bindings/go/README.md shows the lines between
// docs:begin and docs:end.
func ExampleModel_Embed() {
	path := filepath.Join(embedFixtures, "qwen3_embed_f32")
	reranker := filepath.Join(embedFixtures, "qwen3_cross_f32")
	// docs:begin embed
	ctx := context.Background()
	docs := []string{"Paris is the capital of France.", "The quick brown fox jumps over the lazy dog."}
	// path: a sentence-transformers checkpoint (Qwen3-Embedding, EmbeddingGemma) or any decoder
	m, err := forge.LoadModel(path)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	info, err := m.EmbedInfo() // Dim, Pooling, Normalize, MaxTokens, PromptNames, ...
	if err != nil {
		log.Fatal(err)
	}
	d, err := m.Embed(ctx, docs) // one []float32 of info.Dim values per text
	if err != nil {
		log.Fatal(err)
	}
	q, err := m.Embed(ctx, []string{"What is the capital of France?"}, forge.WithPromptName("query"))
	if err != nil {
		log.Fatal(err)
	}
	small, err := m.Embed(ctx, docs, forge.WithDim(16)) // Matryoshka: the first 16 values
	if err != nil {
		log.Fatal(err)
	}
	var cosine float32 // the vectors are unit length (the checkpoint's Normalize module)
	for i := range q[0] {
		cosine += q[0][i] * d[0][i]
	}
	fmt.Println(info.Dim, info.Pooling, len(d), len(small[0]), cosine > -1.0001 && cosine < 1.0001)

	// reranker: a cross-encoder (a `score` head) or Qwen3-Reranker (WithInstruction)
	r, err := forge.LoadModel(reranker)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	scores, err := r.Rerank(ctx, "What is the capital of France?", docs) // WithRawScores: logits
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(scores), scores[0] > scores[1])
	// docs:end embed

	// Output:
	// 64 last 2 16 true
	// 2 true
}
