package forge_test

// Tests of the Go binding on the bundled stories260K model (lavapipe on machines without a
// GPU). Run from bindings/go after `make lib cli` (`make test-go` does it):
//
//	go test ./...
//
// The story is compared with the CLI's: $FORGE_CLI, else build/forge.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	forge "forge.lthn.ai/core/forge/bindings/go"
)

const once = "Once upon a time"

var (
	root      = filepath.Join("..", "..")
	modelPath = filepath.Join(root, "models", "stories260K", "stories260K.gguf")

	sharedOnce  sync.Once
	sharedModel *forge.Model
	sharedErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedModel != nil {
		sharedModel.Close()
	}
	os.Exit(code)
}

// model returns the bundled model, loaded once for the tests that share it.
func model(t *testing.T) *forge.Model {
	t.Helper()
	sharedOnce.Do(func() { sharedModel, sharedErr = forge.LoadModel(modelPath, forge.WithContextLen(512)) })
	if sharedErr != nil {
		t.Fatalf("LoadModel: %v", sharedErr)
	}
	return sharedModel
}

// greedy returns the text and token ids of a greedy run on a fresh session.
func greedy(t *testing.T, m *forge.Model, prompt string, n int) (string, []int32) {
	t.Helper()
	s, err := m.NewSession(forge.SessionConfig{ContextLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var text strings.Builder
	var ids []int32
	for tok := range s.Generate(context.Background(), prompt, forge.WithMaxTokens(n)) {
		text.WriteString(tok.Text)
		if tok.ID >= 0 {
			ids = append(ids, tok.ID)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return text.String(), ids
}

func collect(seq func(func(forge.Token) bool)) (string, []forge.Token) {
	var text strings.Builder
	var toks []forge.Token
	for tok := range seq {
		text.WriteString(tok.Text)
		toks = append(toks, tok)
	}
	return text.String(), toks
}

func cli() string {
	if p := os.Getenv("FORGE_CLI"); p != "" {
		return p
	}
	return filepath.Join(root, "build", "forge")
}

func TestGreedyStoryEqualsTheCLI(t *testing.T) {
	m := model(t)
	out, err := exec.Command(cli(), "run", modelPath, "-p", once, "-n", "32").Output()
	if err != nil {
		t.Fatalf("%s run: %v", cli(), err)
	}
	text, ids := greedy(t, m, once, 32)
	if len(ids) != 32 {
		t.Errorf("generated %d tokens, want 32", len(ids))
	}
	if string(out) != once+text+"\n" {
		t.Errorf("CLI printed %q,\nGo generated %q", out, once+text)
	}
	// Deterministic: the same again, on the model's pooled sessions too.
	again, ids2 := greedy(t, m, once, 32)
	pooled, _ := collect(m.Generate(context.Background(), once, forge.WithMaxTokens(32)))
	if again != text || !slices.Equal(ids, ids2) || pooled != text {
		t.Errorf("greedy runs differ: %q / %q / %q", text, again, pooled)
	}
	// The empty prompt's 256-token story is what `forge run MODEL` prints.
	out, err = exec.Command(cli(), "run", modelPath).Output()
	if err != nil {
		t.Fatal(err)
	}
	story, _ := greedy(t, m, "", 256)
	if !strings.HasPrefix(story, once) || string(out) != story+"\n" {
		t.Errorf("CLI printed %q,\nGo generated %q", out, story)
	}
}

func TestTokensAgreeWithTheTokenizer(t *testing.T) {
	m := model(t)
	text, ids := greedy(t, m, once, 40)
	back, err := m.Detokenize(ids)
	if err != nil || back != text {
		t.Errorf("Detokenize = %q, %v; want %q", back, err, text)
	}
	prompt, err := m.Tokenize(once, true)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := m.SpecialTokens()
	if err != nil {
		t.Fatal(err)
	}
	if prompt[0] != sp.BOS || sp.BOS < 0 {
		t.Errorf("Tokenize(%q, true)[0] = %d, BOS %d", once, prompt[0], sp.BOS)
	}
	if !slices.Contains(sp.EOSIDs, sp.EOS) {
		t.Errorf("EOS %d not in EOSIDs %v", sp.EOS, sp.EOSIDs)
	}
	fromIDs, toks := collect(m.GenerateTokens(context.Background(), prompt, forge.WithMaxTokens(40)))
	if fromIDs != text || len(toks) != 40 {
		t.Errorf("GenerateTokens gave %q (%d tokens), Generate %q", fromIDs, len(toks), text)
	}
	if piece, ok := m.TokenPiece(sp.BOS); !ok || m.TokenID(piece) != sp.BOS {
		t.Errorf("TokenPiece(BOS) = %q, %v", piece, ok)
	}
	if _, ok := m.TokenPiece(1 << 20); ok {
		t.Error("TokenPiece out of range gave a piece")
	}
}

func TestBreakingOutStopsGeneration(t *testing.T) {
	m := model(t)
	s, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := 0
	for range s.Generate(context.Background(), once, forge.WithMaxTokens(100)) {
		n++
		if n == 3 {
			break
		}
	}
	met := s.Metrics()
	if n != 3 || met.StopReason != forge.StopCallback || met.GeneratedTokens != 3 || s.Err() != nil {
		t.Errorf("after break: %d tokens, metrics %+v, err %v", n, met, s.Err())
	}
	// The session stays usable: it continues with what it holds, and a new run equals a fresh one.
	want, _ := greedy(t, m, once, 20)
	got, _ := collect(s.Generate(context.Background(), once, forge.WithMaxTokens(20)))
	if got != want || s.Err() != nil {
		t.Errorf("after break: %q, %v; want %q", got, s.Err(), want)
	}
	// The same through the model's pool.
	n = 0
	for range m.Generate(context.Background(), once, forge.WithMaxTokens(100)) {
		if n++; n == 5 {
			break
		}
	}
	if m.Metrics().StopReason != forge.StopCallback || m.Metrics().GeneratedTokens != 5 || m.Err() != nil {
		t.Errorf("model after break: %+v, %v", m.Metrics(), m.Err())
	}
}

func TestContextCancellationStops(t *testing.T) {
	m := model(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	for range m.Generate(ctx, once, forge.WithMaxTokens(200), forge.WithIgnoreEOS()) {
		if n++; n == 2 {
			cancel()
		}
	}
	met := m.Metrics()
	if !errors.Is(m.Err(), context.Canceled) || met.StopReason != forge.StopCancelled || n >= 200 {
		t.Errorf("after cancel: %d tokens, stop %v, err %v", n, met.StopReason, m.Err())
	}
	// A context already done generates nothing.
	_, toks := collect(m.Generate(ctx, once))
	if len(toks) != 0 || !errors.Is(m.Err(), context.Canceled) {
		t.Errorf("cancelled context: %d tokens, err %v", len(toks), m.Err())
	}
	// A deadline: Err is context.DeadlineExceeded.
	dctx, dcancel := context.WithTimeout(context.Background(), 0)
	defer dcancel()
	<-dctx.Done()
	collect(m.Generate(dctx, once))
	if !errors.Is(m.Err(), context.DeadlineExceeded) {
		t.Errorf("deadline: err %v", m.Err())
	}
	// A normal run afterwards clears Err.
	collect(m.Generate(context.Background(), once, forge.WithMaxTokens(4)))
	if m.Err() != nil || m.Metrics().StopReason != forge.StopMaxTokens {
		t.Errorf("after a normal run: %v, %v", m.Err(), m.Metrics().StopReason)
	}
	// Classify and BatchGenerate honour a done context too.
	if _, err := m.Classify(ctx, []string{once}); !errors.Is(err, context.Canceled) {
		t.Errorf("Classify: %v", err)
	}
	if _, err := m.BatchGenerate(ctx, []string{once}); !errors.Is(err, context.Canceled) {
		t.Errorf("BatchGenerate: %v", err)
	}
}

func TestStopTokensAndStrings(t *testing.T) {
	m := model(t)
	text, ids := greedy(t, m, once, 32)
	i := strings.Index(text, "Lily")
	if i < 0 {
		t.Fatalf("story without Lily: %q", text)
	}
	got, _ := collect(m.Generate(context.Background(), once, forge.WithMaxTokens(32), forge.WithStopStrings("Lily")))
	if got != text[:i] || m.Metrics().StopReason != forge.StopString {
		t.Errorf("stop string: %q (%v), want %q", got, m.Metrics().StopReason, text[:i])
	}
	_, toks := collect(m.Generate(context.Background(), once, forge.WithMaxTokens(32), forge.WithStopTokens(ids[3])))
	if len(toks) != 3 || m.Metrics().StopReason != forge.StopToken {
		t.Errorf("stop token: %d tokens (%v), want 3", len(toks), m.Metrics().StopReason)
	}
}

func TestSamplingIsSeeded(t *testing.T) {
	m := model(t)
	opts := []forge.GenerateOption{forge.WithMaxTokens(24), forge.WithTemperature(0.9), forge.WithTopK(40),
		forge.WithTopP(0.95), forge.WithMinP(0.01), forge.WithRepeatPenalty(1.1), forge.WithSeed(7)}
	a, _ := collect(m.Generate(context.Background(), once, opts...))
	b, _ := collect(m.Generate(context.Background(), once, opts...))
	if a != b || m.Err() != nil {
		t.Errorf("same seed, different text: %q / %q (%v)", a, b, m.Err())
	}
}

func TestLookupDrawsWhatPlainDecodingDraws(t *testing.T) {
	m := model(t)
	story, _ := greedy(t, m, once, 60)
	prompt := once + story + " " + once // the output repeats the prompt: drafts are kept
	opts := []forge.GenerateOption{forge.WithMaxTokens(48), forge.WithTemperature(0.8), forge.WithTopK(40), forge.WithSeed(3)}
	plain, _ := collect(m.Generate(context.Background(), prompt, opts...))
	plainMet := m.Metrics()
	looked, _ := collect(m.Generate(context.Background(), prompt, append(opts, forge.WithLookup(8))...))
	met := m.Metrics()
	if m.Err() != nil || looked != plain {
		t.Errorf("lookup changed the text: %q / %q (%v)", looked, plain, m.Err())
	}
	if plainMet.DraftTokens != 0 || met.DraftAccepted <= 0 || met.DraftAccepted > met.DraftTokens {
		t.Errorf("drafts: plain %d, lookup %d of %d kept", plainMet.DraftTokens, met.DraftAccepted, met.DraftTokens)
	}
	if _, _ = collect(m.Generate(context.Background(), prompt, forge.WithLookup(16))); m.Err() == nil ||
		!strings.Contains(m.Err().Error(), "lookup 16") {
		t.Errorf("lookup 16: %v, want an error naming it", m.Err())
	}
}

func TestDraftModelGivesTheSameText(t *testing.T) {
	m := model(t)
	s, err := m.NewSession(forge.SessionConfig{ContextLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := m.NewSession(forge.SessionConfig{ContextLen: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	opts := []forge.GenerateOption{forge.WithMaxTokens(40), forge.WithTemperature(0.7), forge.WithSeed(2)}
	plain, _ := collect(s.Generate(context.Background(), once, opts...))
	drafted, _ := collect(s.Generate(context.Background(), once, append(opts, forge.WithDraft(d), forge.WithLookup(5))...))
	met := s.Metrics()
	if s.Err() != nil || drafted != plain {
		t.Errorf("the draft changed the text: %q / %q (%v)", drafted, plain, s.Err())
	}
	if met.DraftAccepted <= 0 || met.DraftAccepted > met.DraftTokens {
		t.Errorf("drafts: %d of %d kept", met.DraftAccepted, met.DraftTokens)
	}
	if _, _ = collect(s.Generate(context.Background(), once, forge.WithDraft(s))); s.Err() == nil ||
		!strings.Contains(s.Err().Error(), "the draft session is this session") {
		t.Errorf("drafting for itself: %v, want forge's message", s.Err())
	}
}

func TestChatWithoutTemplateIsUnsupported(t *testing.T) {
	m := model(t)
	msgs := []forge.Message{{Role: "user", Content: "hi"}}
	_, toks := collect(m.Chat(context.Background(), msgs))
	var fe *forge.Error
	if len(toks) != 0 || !errors.Is(m.Err(), forge.StatusUnsupported) || !errors.As(m.Err(), &fe) ||
		!strings.Contains(fe.Message, "chat format") {
		t.Errorf("Chat on stories260K: %d tokens, err %v", len(toks), m.Err())
	}
	if _, err := m.RenderChat(msgs); !errors.Is(err, forge.StatusUnsupported) {
		t.Errorf("RenderChat: %v", err)
	}
}

// makeChatModel writes a one-layer random f16 Llama with hidden 32 beside the real Llama 3
// tokenizer (from ../shared/tokenizers): enough for forge to render Llama 3 chats and generate.
func makeChatModel(t *testing.T) string {
	t.Helper()
	archive := filepath.Join(root, "..", "shared", "tokenizers", "llama3.tar.xz")
	if _, err := os.Stat(archive); err != nil {
		t.Skipf("no Llama 3 tokenizer: %v", err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("tar", "xJf", archive, "-C", dir, "llama3/tokenizer.json", "llama3/tokenizer_config.json").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "llama3")
	const vocab, hidden, head, ffn = 128256, 32, 16, 64
	config, _ := json.Marshal(map[string]any{
		"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": 1, "num_attention_heads": 2,
		"num_key_value_heads": 1, "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 512,
		"rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "float16"})
	if err := os.WriteFile(filepath.Join(out, "config.json"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	p := "model.layers.0."
	names := []string{"model.embed_tokens.weight", "model.norm.weight", p + "input_layernorm.weight",
		p + "post_attention_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
		p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight",
		p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"}
	shapes := [][]int{{vocab, hidden}, {hidden}, {hidden}, {hidden}, {2 * head, hidden}, {head, hidden},
		{head, hidden}, {hidden, 2 * head}, {ffn, hidden}, {ffn, hidden}, {hidden, ffn}}
	rng := rand.New(rand.NewSource(1))
	header := map[string]any{}
	var body []byte
	for i, name := range names {
		n := 1
		for _, d := range shapes[i] {
			n *= d
		}
		data := make([]byte, 2*n)
		rng.Read(data)
		// f16 values of magnitude 1/16 .. 1/8 with random signs: exponent bits 01011.
		for j := 1; j < len(data); j += 2 {
			data[j] = data[j]&0x83 | 0x2C
		}
		header[name] = map[string]any{"dtype": "F16", "shape": shapes[i], "data_offsets": []int{len(body), len(body) + len(data)}}
		body = append(body, data...)
	}
	blob, _ := json.Marshal(header)
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(blob)))
	file = append(append(file, blob...), body...)
	if err := os.WriteFile(filepath.Join(out, "model.safetensors"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestChatStreamsAndReusesTheCache(t *testing.T) {
	m, err := forge.LoadModel(makeChatModel(t), forge.WithContextLen(256))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	turn1 := []forge.Message{{Role: "user", Content: "Hello there!"}}
	rendered, err := m.RenderChat(turn1)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rendered, "<|start_header_id|>user<|end_header_id|>\n\nHello there!<|eot_id|>") ||
		!strings.HasSuffix(rendered, "<|start_header_id|>assistant<|end_header_id|>\n\n") {
		t.Errorf("RenderChat = %q", rendered)
	}
	s, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	reply, _ := collect(s.Chat(context.Background(), turn1, forge.WithMaxTokens(6)))
	m1 := s.Metrics()
	ids, _ := m.Tokenize(rendered, false)
	if s.Err() != nil || m1.PromptTokens != len(ids) || m1.CachedTokens != 0 || m1.GeneratedTokens < 1 || m1.GeneratedTokens > 6 {
		t.Errorf("turn 1: %+v, %v (prompt %d tokens)", m1, s.Err(), len(ids))
	}
	turn2 := append(turn1, forge.Message{Role: "assistant", Content: reply}, forge.Message{Role: "user", Content: "Tell me more."})
	collect(s.Chat(context.Background(), turn2, forge.WithMaxTokens(6)))
	m2 := s.Metrics()
	if s.Err() != nil || m2.CachedTokens < m1.PromptTokens || m2.PromptTokens <= m2.CachedTokens {
		t.Errorf("turn 2: %+v, %v", m2, s.Err())
	}
	sp, _ := m.SpecialTokens()
	if eot := m.TokenID("<|eot_id|>"); sp.EOT != eot || !slices.Contains(sp.EOSIDs, eot) {
		t.Errorf("special tokens %+v, <|eot_id|> %d", sp, eot)
	}
	// Through the model: the pooled session's chat gives the same reply.
	again, _ := collect(m.Chat(context.Background(), turn1, forge.WithMaxTokens(6)))
	if again != reply || m.Err() != nil {
		t.Errorf("Model.Chat = %q, %v; Session.Chat %q", again, m.Err(), reply)
	}
}

func TestClassifyGivesGenerateFirstToken(t *testing.T) {
	m := model(t)
	prompts := []string{once, "Lily and Ben", "The cat sat on the", "One day"}
	res, err := m.Classify(context.Background(), prompts, forge.WithLogits())
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(prompts) {
		t.Fatalf("%d results for %d prompts", len(res), len(prompts))
	}
	for i, p := range prompts {
		text, ids := greedy(t, m, p, 1)
		ptoks, _ := m.Tokenize(p, true)
		r := res[i]
		if r.Token.ID != ids[0] || r.Token.Text != text || r.NumTokens != len(ptoks) {
			t.Errorf("prompt %q: classify %+v (%d tokens), generate %d %q (%d tokens)", p, r.Token, r.NumTokens, ids[0], text, len(ptoks))
		}
		if len(r.Logits) != m.Info().VocabSize {
			t.Fatalf("%d logits", len(r.Logits))
		}
		best := 0
		for j, v := range r.Logits {
			if v > r.Logits[best] {
				best = j
			}
		}
		if int32(best) != r.Token.ID {
			t.Errorf("prompt %q: argmax %d, token %d", p, best, r.Token.ID)
		}
	}
	if met := m.Metrics(); met.PromptTokens == 0 {
		t.Errorf("metrics after Classify: %+v", met)
	}
	// A prompt longer than the batch (512 tokens) fails the call.
	long := strings.Repeat("Once upon a time ", 200)
	if _, err := m.Classify(context.Background(), []string{once, long}); !errors.Is(err, forge.StatusLimit) {
		t.Errorf("a prompt over the batch: %v", err)
	}
}

func TestBatchGenerateEqualsSerialGenerate(t *testing.T) {
	m := model(t)
	prompts := []string{once, "Lily and Ben", "The cat sat on the", "One day", "Tom had a big", "The sun"}
	res, err := m.BatchGenerate(context.Background(), prompts, forge.WithMaxTokens(24))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(prompts) {
		t.Fatalf("%d results for %d prompts", len(res), len(prompts))
	}
	total := 0
	for i, p := range prompts {
		text, ids := greedy(t, m, p, 24)
		r := res[i]
		var got []int32
		for _, tok := range r.Tokens {
			if tok.ID >= 0 {
				got = append(got, tok.ID)
			}
		}
		if r.Err != nil || r.Text != text || !slices.Equal(got, ids) || r.Metrics.GeneratedTokens != len(ids) {
			t.Errorf("prompt %q: batch %q %v (%v), serial %q %v", p, r.Text, got, r.Err, text, ids)
		}
		total += r.Metrics.GeneratedTokens
	}
	if met := m.Metrics(); met.GeneratedTokens != total || met.DecodeTokensPerSec <= 0 {
		t.Errorf("metrics after BatchGenerate: %+v (want %d tokens)", met, total)
	}
	// A prompt longer than the context (512) fails alone.
	long := strings.Repeat("Once upon a time ", 200)
	res, err = m.BatchGenerate(context.Background(), []string{once, long}, forge.WithMaxTokens(4))
	if err != nil || res[0].Err != nil || len(res[0].Tokens) == 0 || !errors.Is(res[1].Err, forge.StatusLimit) {
		t.Errorf("batch with a prompt over the context: %v, %+v", err, res)
	}
}

func TestInfo(t *testing.T) {
	m := model(t)
	info := m.Info()
	if info.VocabSize != 512 || info.NumLayers != 5 || info.Architecture != "llama" || m.ModelType() != "llama" ||
		info.SourceFormat != "gguf" || info.HiddenSize <= 0 || info.NumParams == 0 || info.WeightBytes == 0 ||
		info.DeviceName == "" || info.ContextLen <= 0 {
		t.Errorf("Info = %+v", info)
	}
	if mem, err := m.Memory(); err != nil || mem.DeviceInUseBytes == 0 {
		t.Errorf("Memory = %+v, %v", mem, err)
	}
	if forge.Version() != "0.1.0" {
		t.Errorf("Version = %q", forge.Version())
	}
	devs, err := forge.Devices()
	if err != nil || len(devs) == 0 || !slices.ContainsFunc(devs, func(d forge.Device) bool { return d.Usable }) {
		t.Errorf("Devices = %+v, %v", devs, err)
	}
}

func TestMetricsAfterGeneration(t *testing.T) {
	m := model(t)
	_, toks := collect(m.Generate(context.Background(), once, forge.WithMaxTokens(16)))
	met := m.Metrics()
	if met.PromptTokens != 5 || met.GeneratedTokens != len(toks) || met.GeneratedTokens != 16 ||
		met.StopReason != forge.StopMaxTokens || met.DecodeTokensPerSec <= 0 || met.TimeToFirstToken <= 0 ||
		met.DecodeDuration <= 0 || met.PeakMemoryBytes == 0 {
		t.Errorf("Metrics = %+v", met)
	}
}

func TestErrors(t *testing.T) {
	_, err := forge.LoadModel(filepath.Join(t.TempDir(), "missing.gguf"))
	var fe *forge.Error
	if !errors.As(err, &fe) || fe.Status != forge.StatusIO || !errors.Is(err, forge.StatusIO) ||
		!strings.Contains(fe.Message, "missing.gguf") {
		t.Errorf("missing file: %#v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	os.WriteFile(bad, []byte("this is not a model file"), 0o644)
	if _, err := forge.LoadModel(bad); !errors.Is(err, forge.StatusFormat) {
		t.Errorf("malformed file: %v", err)
	}
	if forge.StatusLimit.String() != "FORGE_ERR_LIMIT" {
		t.Errorf("StatusLimit = %q", forge.StatusLimit)
	}
	// A prompt longer than the context.
	m, err := forge.LoadModel(modelPath, forge.WithContextLen(16))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	collect(m.Generate(context.Background(), strings.Repeat("Once upon a time ", 20)))
	if !errors.Is(m.Err(), forge.StatusLimit) {
		t.Errorf("prompt over the context: %v", m.Err())
	}
}

func TestCloseIsSafe(t *testing.T) {
	m, err := forge.LoadModel(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	collect(m.Generate(context.Background(), once, forge.WithMaxTokens(2)))
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
	if _, toks := collect(m.Generate(context.Background(), once)); len(toks) != 0 || !errors.Is(m.Err(), forge.ErrClosed) {
		t.Errorf("Generate after Close: %d tokens, %v", len(toks), m.Err())
	}
	if _, err := m.Tokenize(once, true); !errors.Is(err, forge.ErrClosed) {
		t.Errorf("Tokenize after Close: %v", err)
	}
	if _, err := m.Classify(context.Background(), []string{once}); !errors.Is(err, forge.ErrClosed) {
		t.Errorf("Classify after Close: %v", err)
	}
	if _, err := m.NewSession(forge.SessionConfig{}); !errors.Is(err, forge.ErrClosed) {
		t.Errorf("NewSession after Close: %v", err)
	}
	collect(s.Generate(context.Background(), once))
	if !errors.Is(s.Err(), forge.ErrClosed) {
		t.Errorf("Session.Generate after Close: %v", s.Err())
	}
}

func TestCloseDuringGenerationCancelsIt(t *testing.T) {
	m, err := forge.LoadModel(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range m.Generate(context.Background(), once, forge.WithMaxTokens(200), forge.WithIgnoreEOS()) {
		if n++; n == 2 {
			m.Close() // from inside the loop: the model is freed when the call returns
		}
	}
	if n >= 200 || !errors.Is(m.Err(), forge.ErrClosed) || m.Metrics().StopReason != forge.StopCancelled {
		t.Errorf("Close during generation: %d tokens, %v, %v", n, m.Err(), m.Metrics().StopReason)
	}
}

func TestSessionRunsOneCallAtATime(t *testing.T) {
	m := model(t)
	s, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var inner error
	for range s.Generate(context.Background(), once, forge.WithMaxTokens(4)) {
		collect(s.Generate(context.Background(), once))
		inner = s.Err()
		break
	}
	if !errors.Is(inner, forge.ErrBusy) {
		t.Errorf("nested call on one session: %v", inner)
	}
	// The model gives a nested call its own session.
	want, _ := greedy(t, m, "Lily", 8)
	var nested string
	for range m.Generate(context.Background(), once, forge.WithMaxTokens(4)) {
		nested, _ = collect(m.Generate(context.Background(), "Lily", forge.WithMaxTokens(8)))
		break
	}
	if nested != want {
		t.Errorf("nested Model.Generate = %q, want %q", nested, want)
	}
}

func TestConcurrentGenerate(t *testing.T) {
	m := model(t)
	want, _ := greedy(t, m, once, 24)
	var wg sync.WaitGroup
	got := make([]string, 4)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], _ = collect(m.Generate(context.Background(), once, forge.WithMaxTokens(24)))
		}()
	}
	wg.Wait()
	for i, g := range got {
		if g != want {
			t.Errorf("goroutine %d: %q, want %q", i, g, want)
		}
	}
}

func TestPanicInTheLoopLeavesTheModelUsable(t *testing.T) {
	m := model(t)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v", r)
			}
		}()
		for range m.Generate(context.Background(), once) {
			panic("boom")
		}
	}()
	if m.Metrics().StopReason != forge.StopCallback {
		t.Errorf("after a panic: %v", m.Metrics().StopReason)
	}
	want, _ := greedy(t, m, once, 8)
	if got, _ := collect(m.Generate(context.Background(), once, forge.WithMaxTokens(8))); got != want {
		t.Errorf("after a panic: %q, want %q", got, want)
	}
}

func TestSessionStateRoundTrip(t *testing.T) {
	m := model(t)
	s, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	collect(s.Generate(context.Background(), once, forge.WithMaxTokens(8)))
	path := filepath.Join(t.TempDir(), "state.safetensors")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	s2, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Load(path); err != nil || s2.NPast() != s.NPast() || s.NPast() == 0 {
		t.Errorf("Load: %v, n_past %d vs %d", err, s2.NPast(), s.NPast())
	}
	if err := s2.Truncate(0); err != nil || s2.NPast() != 0 {
		t.Errorf("Truncate: %v, n_past %d", err, s2.NPast())
	}
	if mem, err := s.Memory(); err != nil || mem.KVCacheBytes == 0 {
		t.Errorf("Memory = %+v, %v", mem, err)
	}
	if err := s2.Load(filepath.Join(t.TempDir(), "none")); !errors.Is(err, forge.StatusIO) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

type prewarmCall struct {
	done, total int
	kernel      string
}

// A model loaded for the test alone (nothing prewarmed on it yet) and a session on it, both
// closed when the test ends.
func unwarmedSession(t *testing.T) (*forge.Model, *forge.Session) {
	t.Helper()
	m, err := forge.LoadModel(modelPath, forge.WithContextLen(512))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// Prewarm reports each kernel, then the end; a second call (from any session of the model)
// reports only the end, and generation gives the same text as without it.
func TestSessionPrewarm(t *testing.T) {
	want, _ := greedy(t, model(t), once, 32)
	m, s := unwarmedSession(t)
	if err := s.Prewarm(-1, nil); !errors.Is(err, forge.StatusInvalidArgument) || !strings.Contains(err.Error(), "n_prompt") {
		t.Errorf("Prewarm(-1): %v", err)
	}
	var calls []prewarmCall
	record := func(calls *[]prewarmCall) func(int, int, string) {
		return func(done, total int, kernel string) { *calls = append(*calls, prewarmCall{done, total, kernel}) }
	}
	if err := s.Prewarm(0, record(&calls)); err != nil {
		t.Fatal(err)
	}
	n := len(calls) - 1
	if n < 1 || calls[n] != (prewarmCall{n, n, ""}) {
		t.Fatalf("Prewarm's calls: %v", calls)
	}
	for i, c := range calls[:n] {
		if c.done != i || c.total != n || c.kernel == "" {
			t.Errorf("call %d: %+v (of %d kernels)", i, c, n)
		}
	}
	var again []prewarmCall
	if err := s.Prewarm(0, record(&again)); err != nil || !slices.Equal(again, []prewarmCall{{0, 0, ""}}) {
		t.Errorf("second Prewarm: %v, %v", again, err)
	}
	if got, _ := collect(s.Generate(context.Background(), once, forge.WithMaxTokens(32))); got != want {
		t.Errorf("after Prewarm: %q, want %q", got, want)
	}
	s2, err := m.NewSession(forge.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	var other []prewarmCall
	if err := s2.Prewarm(16, record(&other)); err != nil || !slices.Equal(other, []prewarmCall{{0, 0, ""}}) {
		t.Errorf("Prewarm on another session: %v, %v", other, err)
	}
	if err := s2.Prewarm(0, nil); err != nil {
		t.Errorf("Prewarm without progress: %v", err)
	}
}

// A panic in Prewarm's progress stops the calls to it and is raised once forge has returned.
func TestPanicInPrewarmProgress(t *testing.T) {
	_, s := unwarmedSession(t)
	calls := 0
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v", r)
			}
		}()
		s.Prewarm(0, func(int, int, string) { calls++; panic("boom") })
	}()
	if calls != 1 {
		t.Errorf("progress called %d times after it panicked", calls)
	}
	var again []prewarmCall
	err := s.Prewarm(0, func(done, total int, kernel string) { again = append(again, prewarmCall{done, total, kernel}) })
	if err != nil || !slices.Equal(again, []prewarmCall{{0, 0, ""}}) { // compiled all the same
		t.Errorf("Prewarm after a panic: %v, %v", again, err)
	}
	if text, _ := collect(s.Generate(context.Background(), once, forge.WithMaxTokens(4))); text == "" {
		t.Error("no text after a panic in Prewarm")
	}
}

// KVF16 halves the KV cache and generates; a state file of one type loads into the other.
func TestSessionKVType(t *testing.T) {
	m := model(t)
	s32, err := m.NewSession(forge.SessionConfig{KVType: forge.KVF32})
	if err != nil {
		t.Fatal(err)
	}
	defer s32.Close()
	s16, err := m.NewSession(forge.SessionConfig{KVType: forge.KVF16})
	if err != nil {
		t.Fatal(err)
	}
	defer s16.Close()
	if s32.KVType() != forge.KVF32 || s16.KVType() != forge.KVF16 {
		t.Errorf("KVType = %v, %v", s32.KVType(), s16.KVType())
	}
	m32, err1 := s32.Memory()
	m16, err2 := s16.Memory()
	if err1 != nil || err2 != nil || m16.KVCacheBytes == 0 || 2*m16.KVCacheBytes != m32.KVCacheBytes {
		t.Errorf("KV cache bytes f16 %d, f32 %d (%v, %v)", m16.KVCacheBytes, m32.KVCacheBytes, err1, err2)
	}
	if text, _ := collect(s16.Generate(context.Background(), once, forge.WithMaxTokens(8))); text == "" {
		t.Error("no text from the f16 cache")
	}
	path := filepath.Join(t.TempDir(), "f16.state")
	if err := s16.Save(path); err != nil {
		t.Fatal(err)
	}
	if err := s32.Load(path); err != nil || s32.NPast() != s16.NPast() {
		t.Errorf("Load of an f16 state into an f32 session: %v, n_past %d vs %d", err, s32.NPast(), s16.NPast())
	}
	if _, err := m.NewSession(forge.SessionConfig{KVType: 7}); !errors.Is(err, forge.StatusInvalidArgument) {
		t.Errorf("KVType 7: %v", err)
	}
}

func TestExampleStreamsTheStory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the example")
	}
	m := model(t)
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goTool, "run", "./bindings/go/examples/run")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go run: %v\n%s", err, out)
	}
	story, _ := greedy(t, m, once, 64)
	if !strings.HasPrefix(string(out), once+story+"\n") || !strings.Contains(string(out), "tokens/s") ||
		!strings.Contains(string(out), "no chat template") {
		t.Errorf("example printed %q", out)
	}
}

func TestDiscover(t *testing.T) {
	found, err := forge.Discover(filepath.Join(root, "models"), 8, false)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(found, func(d forge.DiscoveredModel) bool { return filepath.Base(d.Path) == "stories260K.gguf" })
	if i < 0 {
		t.Fatalf("stories260K not found: %+v", found)
	}
	d := found[i]
	if d.Format != "gguf" || d.Architecture != "llama" || !d.Loadable || d.Err != nil || d.NumFiles != 1 || d.Bytes == 0 || d.NumParams == 0 {
		t.Errorf("Discover = %+v", d)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bad.gguf"), []byte("this is not a model file"), 0o644)
	found, err = forge.Discover(dir, 0, false)
	if err != nil || len(found) != 1 || found[0].Loadable || !errors.Is(found[0].Err, forge.StatusFormat) {
		t.Errorf("Discover of a bad file: %+v, %v", found, err)
	}
	if _, err := forge.Discover(filepath.Join(dir, "none"), 0, false); !errors.Is(err, forge.StatusIO) {
		t.Errorf("Discover of a missing directory: %v", err)
	}
}

func TestCloseWhileOtherGoroutinesGenerate(t *testing.T) {
	m, err := forge.LoadModel(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	var started, done sync.WaitGroup
	counts := make([]int, 4)
	for i := range counts {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			first := true
			for range m.Generate(context.Background(), once, forge.WithMaxTokens(400), forge.WithIgnoreEOS()) {
				if counts[i]++; first {
					first = false
					started.Done()
				}
			}
			if first {
				started.Done()
			}
		}()
	}
	started.Wait() // every goroutine has its first token
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	done.Wait()
	for i, n := range counts {
		if n == 0 || n >= 400 {
			t.Errorf("goroutine %d: %d tokens", i, n)
		}
	}
	if !errors.Is(m.Err(), forge.ErrClosed) {
		t.Errorf("Err after Close = %v", m.Err())
	}
}

// zoraBatch returns texts [from, from+n) of the training fixture, tokenized with BOS.
func zoraBatch(t *testing.T, m *forge.Model, from, n int) forge.TrainBatch {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "tests", "fixtures", "train", "zora_train.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var b forge.TrainBatch
	for _, line := range lines[from : from+n] {
		var rec struct{ Text string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		ids, err := m.Tokenize(rec.Text, true)
		if err != nil {
			t.Fatal(err)
		}
		b.Tokens = append(b.Tokens, ids)
	}
	return b
}

func TestTrainingLowersTheLossAndSavesAnAdapterThatLoads(t *testing.T) {
	m, err := forge.LoadModel(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tr, err := m.NewTrainer(forge.WithRank(8, 16), forge.WithTargets("all"), forge.WithLearningRate(1e-2),
		forge.WithTrainBatch(4, 128), forge.WithTrainSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	first, second := zoraBatch(t, m, 0, 4), zoraBatch(t, m, 4, 4)
	before, counted, err := tr.Eval(first)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, r := range first.Tokens {
		want += int64(len(r) - 1)
	}
	if counted != want {
		t.Errorf("Eval counted %d targets, want %d", counted, want)
	}
	st, err := tr.Step(first)
	if err != nil {
		t.Fatal(err)
	}
	// the step reports the loss before its update: with fresh adapters (B = 0), the base's
	if !st.Applied || st.Step != 1 || st.Tokens != counted || math.Abs(st.Loss-before) > 1e-6*before {
		t.Errorf("first step %+v, eval loss %v", st, before)
	}
	for i := 1; i < 10; i++ {
		b := first
		if i%2 == 1 {
			b = second
		}
		if st, err = tr.Step(b); err != nil || st.Step != i+1 || math.IsNaN(st.Loss) {
			t.Fatalf("step %d: %+v %v", i, st, err)
		}
	}
	after, _, err := tr.Eval(first)
	if err != nil || after > 0.8*before {
		t.Errorf("loss %v -> %v (%v)", before, after, err)
	}
	dir := t.TempDir()
	if err := tr.Save(dir, forge.AdapterPEFT); err != nil {
		t.Fatal(err)
	}
	mlx := t.TempDir()
	if err := tr.Save(mlx, forge.AdapterMLX); err != nil {
		t.Fatal(err)
	}
	tr.Close()
	for _, saved := range []string{dir, mlx} {
		again, err := m.NewTrainer(forge.WithStartAdapter(saved), forge.WithTrainBatch(4, 128))
		if err != nil {
			t.Fatal(err)
		}
		if loss, _, err := again.Eval(first); err != nil || math.Abs(loss-after) > 1e-5*after {
			t.Errorf("trainer from %s: loss %v, the saver's %v (%v)", saved, loss, after, err)
		}
		again.Close()
	}
	prompt := "Once upon a time, there was a little girl named"
	base, _ := greedy(t, m, prompt, 6)
	tuned, err := forge.LoadModel(modelPath, forge.WithAdapterPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer tuned.Close()
	if text, _ := greedy(t, tuned, prompt, 6); text == base {
		t.Errorf("the adapter did not change the greedy text %q", text)
	}
}

func TestTrainingErrors(t *testing.T) {
	m, err := forge.LoadModel(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.NewTrainer(forge.WithSchedule(forge.ScheduleCosine, 0, 0)); !errors.Is(err, forge.StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "total_steps") {
		t.Errorf("cosine without total steps: %v", err)
	}
	if _, err := m.NewTrainer(forge.WithStartAdapter(filepath.Join(t.TempDir(), "none"))); !errors.Is(err, forge.StatusIO) {
		t.Errorf("missing adapter: %v", err)
	}
	tr, err := m.NewTrainer(forge.WithTrainBatch(2, 16))
	if err != nil {
		t.Fatal(err)
	}
	row := []int32{1, 2, 3}
	if _, err := tr.Step(forge.TrainBatch{Tokens: [][]int32{row, row, row}}); !errors.Is(err, forge.StatusLimit) {
		t.Errorf("3 sequences on a 2-sequence plan: %v", err)
	}
	if _, err := tr.Step(forge.TrainBatch{Tokens: [][]int32{{1, 2, 100000}}}); !errors.Is(err, forge.StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "100000") {
		t.Errorf("an id outside the vocabulary: %v", err)
	}
	if _, _, err := tr.Eval(forge.TrainBatch{Tokens: [][]int32{row}, Labels: [][]int32{{1, 2}}}); !errors.Is(err, forge.StatusInvalidArgument) {
		t.Errorf("a short labels row: %v", err)
	}
	// labels -100 on the first tokens and a mask zero there count the same targets
	ids, _ := m.Tokenize(once+" there was a girl", true)
	n := len(ids)
	labels, mask := slices.Clone(ids), make([]uint8, n)
	for i := range labels {
		if i < n/2 {
			labels[i] = -100
		} else {
			mask[i] = 1
		}
	}
	l1, c1, err1 := tr.Eval(forge.TrainBatch{Tokens: [][]int32{ids}, Labels: [][]int32{labels}})
	l2, c2, err2 := tr.Eval(forge.TrainBatch{Tokens: [][]int32{ids}, Mask: [][]uint8{mask}})
	if err1 != nil || err2 != nil || c1 != int64(n-n/2) || c1 != c2 || math.Abs(l1-l2) > 1e-6*l1 {
		t.Errorf("labels %v %d %v, mask %v %d %v", l1, c1, err1, l2, c2, err2)
	}
	m.Close() // frees the trainer first
	if _, err := tr.Step(forge.TrainBatch{Tokens: [][]int32{row}}); !errors.Is(err, forge.ErrClosed) {
		t.Errorf("a step after the model's Close: %v", err)
	}
	tr.Close()
}

// weatherSchema is a JSON Schema for constrained generation and a tool's parameters;
// validWeather checks a JSON text against it.
const weatherSchema = `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, ` +
	`"unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, ` +
	`"required": ["city", "unit", "days"], "additionalProperties": false}`

func validWeather(text string) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &obj); err != nil {
		return err
	}
	var city, unit string
	if len(obj) != 3 || json.Unmarshal(obj["city"], &city) != nil || json.Unmarshal(obj["unit"], &unit) != nil {
		return fmt.Errorf("not the schema's properties: %s", text)
	}
	if utf8.RuneCountInString(city) > 12 || (unit != "celsius" && unit != "fahrenheit") {
		return fmt.Errorf("city %q, unit %q", city, unit)
	}
	return intIn(obj["days"], 1, 7)
}

// intIn checks that a JSON value is an integer in [lo, hi].
func intIn(raw json.RawMessage, lo, hi int64) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	n, ok := v.(json.Number)
	if !ok {
		return fmt.Errorf("%s is not a number", raw)
	}
	i, err := n.Int64()
	if err != nil || i < lo || i > hi {
		return fmt.Errorf("%s is not an integer in [%d, %d]", raw, lo, hi)
	}
	return nil
}

// clockSchema is another tool's parameters, as a Go value that encoding/json marshals.
var clockSchema = map[string]any{"type": "object", "properties": map[string]any{
	"zone": map[string]any{"type": "integer", "minimum": -12, "maximum": 14}},
	"required": []string{"zone"}, "additionalProperties": false}

func validClock(text string) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &obj); err != nil {
		return err
	}
	if len(obj) != 1 || obj["zone"] == nil {
		return fmt.Errorf("not the schema's properties: %s", text)
	}
	return intIn(obj["zone"], -12, 14)
}

// A JSON Schema on random weights, greedy and sampled: every output that ends matched parses
// and validates; every other one stopped at max tokens (as tests/test_grammar.cpp's
// Constrained.RandomWeightOutputsValidate).
func TestJSONSchemaConstrainsGenerate(t *testing.T) {
	m, err := forge.LoadModel(makeChatModel(t), forge.WithContextLen(256))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	complete, forced, total := 0, 0, 0
	check := func(what, text string, valid func(string) error) {
		t.Helper()
		met := m.Metrics()
		total++
		if m.Err() != nil {
			t.Fatalf("%s: %v", what, m.Err())
		}
		if !met.ConstraintComplete {
			if met.StopReason != forge.StopMaxTokens {
				t.Errorf("%s: incomplete, stopped by %v: %q", what, met.StopReason, text)
			}
			return
		}
		complete++
		forced += met.ForcedTokens
		if met.StopReason != forge.StopConstraint && met.StopReason != forge.StopEOS {
			t.Errorf("%s: complete, stopped by %v", what, met.StopReason)
		}
		if err := valid(text); err != nil {
			t.Errorf("%s: %v\n%s", what, err, text)
		}
	}
	for i, run := range []struct {
		temp float32
		seed uint64
	}{{0, 0}, {1.2, 1}, {1.2, 2}} {
		what := fmt.Sprintf("T %v seed %d", run.temp, run.seed)
		opts := []forge.GenerateOption{forge.WithTemperature(run.temp), forge.WithSeed(run.seed), forge.WithMaxTokens(40)}
		text, _ := collect(m.Generate(ctx, "Answer in JSON:", append(opts, forge.WithJSONSchema(weatherSchema))...))
		check("weather "+what, text, validWeather)
		if i < 2 { // the schema as a Go value
			text, _ = collect(m.Generate(ctx, "Answer in JSON:", append(opts, forge.WithJSONSchema(clockSchema))...))
			check("clock "+what, text, validClock)
		}
	}
	text, _ := collect(m.Generate(ctx, "Answer in JSON:", forge.WithJSONObject(), forge.WithMaxTokens(40)))
	check("object", text, func(s string) error {
		var obj map[string]any
		return json.Unmarshal([]byte(s), &obj)
	})
	if complete < total/2 || forced == 0 {
		t.Errorf("%d of %d runs matched whole, %d forced tokens", complete, total, forced)
	}
	// WithSampleForced samples what the schema forces; a schema as []byte is the same schema.
	raw, _ := json.Marshal(clockSchema)
	text, _ = collect(m.Generate(ctx, "JSON:", forge.WithJSONSchema(raw), forge.WithSampleForced(), forge.WithMaxTokens(24)))
	if met := m.Metrics(); m.Err() != nil || met.ForcedTokens != 0 || (met.ConstraintComplete && validClock(text) != nil) {
		t.Errorf("sample forced: %+v, %v: %q", met, m.Err(), text)
	}
}

// A GBNF grammar on the bundled model, greedy and sampled: a whole match is the grammar's.
func TestGrammarConstrainsGenerate(t *testing.T) {
	m := model(t)
	grammar := "root ::= (\"yes\" | \"no\") \", \" [a-z]{3,8} \" \" [0-9]{1,3} \".\"\n"
	re := regexp.MustCompile(`^(yes|no), [a-z]{3,8} [0-9]{1,3}\.$`)
	complete := 0
	for i, temp := range []float32{0, 1, 2} {
		text, _ := collect(m.Generate(context.Background(), once, forge.WithGrammar(grammar), forge.WithTemperature(temp),
			forge.WithSeed(uint64(i)), forge.WithMaxTokens(24)))
		met := m.Metrics()
		if m.Err() != nil {
			t.Fatal(m.Err())
		}
		if met.ConstraintComplete {
			complete++
			if !re.MatchString(text) || met.StopReason != forge.StopConstraint {
				t.Errorf("T %v: %q, %v", temp, text, met.StopReason)
			}
		} else if met.StopReason != forge.StopMaxTokens {
			t.Errorf("T %v: incomplete %q, %v", temp, text, met.StopReason)
		}
	}
	if complete == 0 {
		t.Error("no run matched the grammar whole")
	}
}

// Classify with choices gives the choice greedy Generate writes; BatchGenerate's items are
// constrained as Generate is.
func TestChoices(t *testing.T) {
	m := model(t)
	ctx := context.Background()
	choices := []string{"positive", "negative", "neutral", "positively not", "n/a"}
	prompts := []string{"Great movie!", "Awful.", "It was a film.", "Meh", "No comment"}
	res, err := m.Classify(ctx, prompts, forge.WithChoices(choices...))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range prompts {
		if res[i].Choice < 0 || res[i].Choice >= len(choices) {
			t.Fatalf("%q: choice %d", p, res[i].Choice)
		}
		text, _ := collect(m.Generate(ctx, p, forge.WithChoices(choices...), forge.WithMaxTokens(20)))
		if text != choices[res[i].Choice] || !m.Metrics().ConstraintComplete {
			t.Errorf("%q: Classify chose %q, Generate wrote %q", p, choices[res[i].Choice], text)
		}
	}
	if res, err := m.Classify(ctx, prompts[:1]); err != nil || res[0].Choice != -1 {
		t.Errorf("without choices: %+v, %v", res, err)
	}
	batch, err := m.BatchGenerate(ctx, prompts[:3], forge.WithChoices(choices...), forge.WithMaxTokens(20),
		forge.WithTemperature(0.8), forge.WithSeed(5))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range batch {
		alone, _ := collect(m.Generate(ctx, prompts[i], forge.WithChoices(choices...), forge.WithMaxTokens(20),
			forge.WithTemperature(0.8), forge.WithSeed(5)))
		if r.Err != nil || r.Text != alone || !slices.Contains(choices, r.Text) || !r.Metrics.ConstraintComplete {
			t.Errorf("item %d: %q (%v), Generate %q", i, r.Text, r.Err, alone)
		}
	}
}

func TestConstraintErrors(t *testing.T) {
	m := model(t)
	ctx := context.Background()
	var fe *forge.Error
	// Two kinds at once: the call fails before any work, naming both options.
	_, toks := collect(m.Generate(ctx, once, forge.WithGrammar(`root ::= "a"`), forge.WithJSONSchema(weatherSchema)))
	if len(toks) != 0 || !errors.Is(m.Err(), forge.StatusInvalidArgument) || !errors.As(m.Err(), &fe) ||
		!strings.Contains(fe.Message, "WithGrammar") || !strings.Contains(fe.Message, "WithJSONSchema") {
		t.Errorf("two constraints: %d tokens, %v", len(toks), m.Err())
	}
	if _, err := m.Classify(ctx, []string{once}, forge.WithChoices("a", "b"), forge.WithJSONObject()); !errors.Is(err, forge.StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "WithChoices and WithJSONObject") {
		t.Errorf("Classify with two constraints: %v", err)
	}
	if _, err := m.BatchGenerate(ctx, []string{once}, forge.WithJSONObject(), forge.WithGrammar(`root ::= "a"`)); !errors.Is(err, forge.StatusInvalidArgument) {
		t.Errorf("BatchGenerate with two constraints: %v", err)
	}
	collect(m.Generate(ctx, once, forge.WithConstraintTrigger("{")))
	if !errors.Is(m.Err(), forge.StatusInvalidArgument) {
		t.Errorf("a trigger without a constraint: %v", m.Err())
	}
	collect(m.Generate(ctx, once, forge.WithJSONSchema(make(chan int))))
	if !errors.Is(m.Err(), forge.StatusInvalidArgument) || !strings.Contains(m.Err().Error(), "chan int") {
		t.Errorf("a schema that does not marshal: %v", m.Err())
	}
	// The library's errors: an unsupported keyword, a grammar error, a trigger in Classify.
	collect(m.Generate(ctx, once, forge.WithJSONSchema(`{"type": "integer", "multipleOf": 3}`)))
	if !errors.Is(m.Err(), forge.StatusUnsupported) || !strings.Contains(m.Err().Error(), "multipleOf") {
		t.Errorf("an unsupported keyword: %v", m.Err())
	}
	collect(m.Generate(ctx, once, forge.WithGrammar("root ::= nope")))
	if !errors.Is(m.Err(), forge.StatusInvalidArgument) || !strings.Contains(m.Err().Error(), "'nope'") {
		t.Errorf("an undefined rule: %v", m.Err())
	}
	if _, err := m.Classify(ctx, []string{once}, forge.WithJSONObject(), forge.WithConstraintTrigger("{")); !errors.Is(err, forge.StatusInvalidArgument) ||
		!strings.Contains(err.Error(), "trigger") {
		t.Errorf("Classify with a trigger: %v", err)
	}
	// The model is still fine.
	if text, _ := collect(m.Generate(ctx, once, forge.WithJSONObject(), forge.WithMaxTokens(8))); m.Err() != nil || !strings.HasPrefix(text, "{") {
		t.Errorf("after the errors: %q, %v", text, m.Err())
	}
}

// makeToolModel is makeChatModel with Llama 3.2's chat template (tools, the "tool" role) as
// chat_template.jinja, which forge reads when tokenizer_config.json has no chat_template.
func makeToolModel(t *testing.T) string {
	t.Helper()
	dir := makeChatModel(t)
	tmpl, err := os.ReadFile(filepath.Join(root, "tests", "fixtures", "chat", "llama3.2-instruct.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tokenizer_config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	delete(cfg, "chat_template")
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), tmpl, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

var (
	weatherTool = forge.Tool{Name: "get_weather", Description: "Weather in a city.", Parameters: weatherSchema}
	clockTool   = forge.Tool{Name: "get_time", Parameters: clockSchema}
)

func TestToolCalls(t *testing.T) {
	m, err := forge.LoadModel(makeToolModel(t), forge.WithContextLen(1024))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	user := []forge.Message{{Role: "user", Content: "Weather in Paris?"}}

	t.Run("RenderWithTools", func(t *testing.T) {
		plain, err := m.RenderChat(user)
		if err != nil {
			t.Fatal(err)
		}
		rendered, err := m.RenderChat(user, forge.WithTools(weatherTool, clockTool))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Environment: ipython\n", `"name": "get_weather"`, `"description": "Weather in a city."`,
			`"name": "get_time"`, `"maxLength": 12`, `"minimum": -12`, "Weather in Paris?<|eot_id|>"} {
			if !strings.Contains(rendered, want) {
				t.Errorf("RenderChat with tools lacks %q:\n%s", want, rendered)
			}
		}
		if strings.Contains(plain, "get_weather") || !strings.HasSuffix(rendered, "<|start_header_id|>assistant<|end_header_id|>\n\n") {
			t.Errorf("without tools %q,\nwith them %q", plain, rendered)
		}
		if _, err := m.RenderChat(user, forge.WithTools(forge.Tool{Description: "no name"})); !errors.Is(err, forge.StatusInvalidArgument) {
			t.Errorf("a tool without a name: %v", err)
		}
		if _, err := m.RenderChat(user, forge.WithTools(forge.Tool{Name: "f", Parameters: func() {}})); !errors.Is(err, forge.StatusInvalidArgument) ||
			!strings.Contains(err.Error(), "tool 0 (f)") {
			t.Errorf("parameters that do not marshal: %v", err)
		}
		if _, err := model(t).RenderChat(user, forge.WithTools(weatherTool)); !errors.Is(err, forge.StatusUnsupported) {
			t.Errorf("tools on a model without a chat format: %v", err)
		}
	})

	t.Run("HistoryWithACallAndItsResult", func(t *testing.T) {
		history := append(slices.Clone(user),
			forge.Message{Role: "assistant", ToolCalls: []forge.ToolCall{{Name: "get_weather", Arguments: `{"city": "Paris", "unit": "celsius", "days": 3}`}}},
			forge.Message{Role: "tool", Content: `{"temp": 21.5}`})
		rendered, err := m.RenderChat(history, forge.WithTools(weatherTool))
		if err != nil {
			t.Fatal(err)
		}
		want := "<|start_header_id|>assistant<|end_header_id|>\n\n" +
			`{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius", "days": 3}}<|eot_id|>` +
			"<|start_header_id|>ipython<|end_header_id|>\n\n" + `"{\"temp\": 21.5}"<|eot_id|>` +
			"<|start_header_id|>assistant<|end_header_id|>\n\n"
		if !strings.HasSuffix(rendered, want) {
			t.Errorf("RenderChat = %q,\nwant the suffix %q", rendered, want)
		}
		// The template takes one call a message.
		two := slices.Clone(history)
		two[1].ToolCalls = append(two[1].ToolCalls, forge.ToolCall{Name: "get_time"})
		if _, err := m.RenderChat(two, forge.WithTools(weatherTool)); !errors.Is(err, forge.StatusInvalidArgument) {
			t.Errorf("two calls in a message: %v", err)
		}
	})

	// As tests/test_grammar.cpp's ToolCalls.RequiredCallsValidateOnRandomWeights.
	t.Run("RequiredCallsValidate", func(t *testing.T) {
		s, err := m.NewSession(forge.SessionConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tools := forge.WithTools(weatherTool, clockTool)
		complete := 0
		var last forge.ChatReply
		for _, run := range []struct {
			temp float32
			seed uint64
		}{{0, 0}, {1.2, 1}, {1.2, 2}} {
			opts := []forge.GenerateOption{tools, forge.WithRequiredToolCalls(), forge.WithTemperature(run.temp),
				forge.WithSeed(run.seed), forge.WithMaxTokens(96)}
			reply, err := s.ChatTools(ctx, user, opts...)
			what := fmt.Sprintf("T %v seed %d: %q", run.temp, run.seed, reply.Text)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			met := s.Metrics()
			if !met.ConstraintComplete {
				if met.StopReason != forge.StopMaxTokens {
					t.Errorf("%s: incomplete, stopped by %v", what, met.StopReason)
				}
				continue
			}
			complete++
			if len(reply.ToolCalls) != 1 || reply.Content != "" {
				t.Fatalf("%s: calls %+v, content %q", what, reply.ToolCalls, reply.Content)
			}
			call := reply.ToolCalls[0]
			if len(call.ID) != 9 {
				t.Errorf("%s: the call's ID %q is not 9 characters", what, call.ID)
			}
			switch call.Name {
			case "get_weather":
				err = validWeather(call.Arguments)
			case "get_time":
				err = validClock(call.Arguments)
			default:
				err = fmt.Errorf("no tool %q", call.Name)
			}
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
			if complete == 1 { // Chat streams the same reply
				streamed, _ := collect(s.Chat(ctx, user, opts...))
				if s.Err() != nil || streamed != reply.Text {
					t.Errorf("%s: Chat streamed %q, %v", what, streamed, s.Err())
				}
			}
			last = reply
		}
		if complete < 2 {
			t.Fatalf("%d of 3 runs made a whole call", complete)
		}
		// The call and its result go back into the conversation.
		history := append(slices.Clone(user), last.Message(), forge.Message{Role: "tool", Content: `{"ok": true}`})
		rendered, err := m.RenderChat(history, tools)
		if err != nil || !strings.Contains(rendered, `"name": "`+last.ToolCalls[0].Name+`"`) {
			t.Errorf("the reply in the history: %v\n%s", err, rendered)
		}
		if _, err := s.ChatTools(ctx, history, tools, forge.WithMaxTokens(4)); err != nil || s.Metrics().CachedTokens == 0 {
			t.Errorf("the next turn: %v, %+v", err, s.Metrics())
		}
		// Without the options the reply is free text, parsed as content.
		reply, err := m.ChatTools(ctx, user, tools, forge.WithMaxTokens(8))
		if err != nil || len(reply.ToolCalls) != 0 || reply.Content != strings.TrimSpace(reply.Text) || m.Metrics().GeneratedTokens == 0 {
			t.Errorf("free reply %+v, %v", reply, err)
		}
	})

	// Mistral v0.3's template writes each call with its ID and each result with the ID it answers.
	t.Run("MistralCallsAndResultsCarryIDs", func(t *testing.T) {
		dir := t.TempDir()
		src := m.Path()
		for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
			if err := os.Symlink(filepath.Join(src, name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		tmpl, err := os.ReadFile(filepath.Join(root, "tests", "fixtures", "chat", "mistral-7b-instruct-v0.3.jinja"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), tmpl, 0o644); err != nil {
			t.Fatal(err)
		}
		mm, err := forge.LoadModel(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer mm.Close()
		history := append(slices.Clone(user),
			forge.Message{Role: "assistant", ToolCalls: []forge.ToolCall{{Name: "get_weather", Arguments: `{"city": "Paris"}`, ID: "c4llW3ath"}}},
			forge.Message{Role: "tool", Content: `{"temp": 21.5}`, ToolCallID: "c4llW3ath"})
		rendered, err := mm.RenderChat(history, forge.WithTools(weatherTool))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather"`,
			`[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c4llW3ath"}]`,
			`[TOOL_RESULTS] {"content": {"temp": 21.5}, "call_id": "c4llW3ath"}[/TOOL_RESULTS]`} {
			if !strings.Contains(rendered, want) {
				t.Errorf("RenderChat lacks %q:\n%s", want, rendered)
			}
		}
		history[2].ToolCallID = ""
		if _, err := mm.RenderChat(history, forge.WithTools(weatherTool)); !errors.Is(err, forge.StatusInvalidArgument) ||
			!strings.Contains(err.Error(), "length 9") {
			t.Errorf("a result without its call's ID: %v", err)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		_, err := m.ChatTools(ctx, user, forge.WithTools(weatherTool), forge.WithStrictToolCalls(), forge.WithJSONObject())
		if !errors.Is(err, forge.StatusInvalidArgument) || !strings.Contains(err.Error(), "constraint") {
			t.Errorf("strict tool calls and a constraint: %v", err)
		}
		collect(m.Chat(ctx, user, forge.WithRequiredToolCalls()))
		if !errors.Is(m.Err(), forge.StatusInvalidArgument) || !strings.Contains(m.Err().Error(), "need tools") {
			t.Errorf("required tool calls without tools: %v", m.Err())
		}
		bad := forge.Tool{Name: "f", Parameters: `{"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}`}
		if _, err := m.ChatTools(ctx, user, forge.WithTools(bad), forge.WithRequiredToolCalls()); !errors.Is(err, forge.StatusUnsupported) ||
			!strings.Contains(err.Error(), "multipleOf") {
			t.Errorf("a tool's unsupported keyword: %v", err)
		}
	})
}
