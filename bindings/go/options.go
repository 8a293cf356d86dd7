package forge

/*
#include "forge.h"
*/
import "C"

import "fmt"

// Overflow is forge_overflow: what a session does when the next token would not fit its
// context.
type Overflow int

// The forge_overflow policies of forge.h.
const (
	OverflowFail      Overflow = 0 // generation stops with StopContext
	OverflowShift     Overflow = 1 // llama.cpp's context shift: cheap, approximate
	OverflowRecompute Overflow = 2 // re-evaluate the kept tokens: exact
)

// KVType is forge_kv_type: what a session's KV cache holds.
type KVType int

// The forge_kv_type values of forge.h.
const (
	KVDefault KVType = 0 // f16 on GPUs, f32 on CPU devices and with WithExact
	KVF32     KVType = 1 // every key and value as computed
	KVF16     KVType = 2 // rounded to f16: half the cache (head_dim a multiple of 4)
	KVQ8_0    KVType = 3 // llama.cpp's q8_0 blocks: 0.53-0.56x f16's cache (head_dim a multiple of 32)
)

// LoadConfig holds what LoadModel's options set. The zero value of each field means forge's
// default.
type LoadConfig struct {
	ContextLen      int      // tokens each session's KV cache holds; 0: min(the model's, 4096)
	BatchSize       int      // most tokens per prefill step (and per Classify batch); 0: 512
	BatchSequences  int      // sequences BatchGenerate decodes at once; 0: 4
	Overflow        Overflow // what a full context does
	Keep            int      // tokens a context slide never drops; 0: the BOS token
	KVType          KVType   // the sessions' KV cache type; KVDefault: f16 on GPUs
	AdapterPath     string   // a LoRA adapter directory (PEFT or mlx-lm); "": none
	AdapterMerge    bool     // add the adapter into the base weights at load
	DeviceIndex     int      // the Vulkan device's index (Devices); -1: forge's choice
	DeviceName      string   // if set: the first device whose name contains it
	Exact           bool     // keep every product in f32 (no tensor-core matmul)
	ParallelSlots   int      // most calls running at once on the model; 0: no cap
	MaxDeviceMemory uint64   // device memory budget in bytes; 0: the device's largest heap
}

// LoadOption sets a LoadConfig field (functional options, as go-mlx's).
type LoadOption func(*LoadConfig)

// WithContextLen sets the context length (KV cache tokens) of the model's sessions.
func WithContextLen(n int) LoadOption { return func(c *LoadConfig) { c.ContextLen = n } }

// WithAdapterPath applies a LoRA adapter directory (PEFT: adapter_config.json +
// adapter_model.safetensors, or mlx-lm: adapter_config.json + adapters.safetensors) beside
// the base weights.
func WithAdapterPath(path string) LoadOption { return func(c *LoadConfig) { c.AdapterPath = path } }

// WithAdapterMerge adds the adapter (WithAdapterPath) into the base weights at load instead
// of running it beside them (f32, f16 and bf16 weights only).
func WithAdapterMerge() LoadOption { return func(c *LoadConfig) { c.AdapterMerge = true } }

// WithBatchSize sets the most tokens a prefill step evaluates (also the longest prompt and
// the most tokens per batch Classify takes).
func WithBatchSize(n int) LoadOption { return func(c *LoadConfig) { c.BatchSize = n } }

// WithBatchSequences sets how many sequences BatchGenerate decodes at once (each has its own
// WithContextLen of KV cache).
func WithBatchSequences(n int) LoadOption { return func(c *LoadConfig) { c.BatchSequences = n } }

// WithOverflow sets what a full context does: OverflowFail (the default) stops generation,
// OverflowShift and OverflowRecompute slide the context so generation can go on; keep tokens
// at the start (0: the BOS token) are never dropped.
func WithOverflow(policy Overflow, keep int) LoadOption {
	return func(c *LoadConfig) { c.Overflow, c.Keep = policy, keep }
}

// WithKVType sets the KV cache type of the model's sessions: KVF16 halves the cache (the
// default on GPUs), KVF32 keeps keys and values exact (the default on CPU devices and with
// WithExact), KVQ8_0 takes 0.53-0.56x of KVF16's memory (head_dim a multiple of 32).
func WithKVType(t KVType) LoadOption { return func(c *LoadConfig) { c.KVType = t } }

// WithDeviceIndex picks the Vulkan device by its index in Devices().
func WithDeviceIndex(i int) LoadOption { return func(c *LoadConfig) { c.DeviceIndex = i } }

// WithDeviceName picks the first Vulkan device whose name contains name.
func WithDeviceName(name string) LoadOption { return func(c *LoadConfig) { c.DeviceName = name } }

// WithExact keeps every product in f32 (no tensor cores, no int8 activations for Q4_0 / Q8_0
// products: on GPUs a decode step's, on CPU devices such as lavapipe, where they run on the
// host, a prompt's too): slower, results those of the f32 kernels.
func WithExact() LoadOption { return func(c *LoadConfig) { c.Exact = true } }

// WithParallelSlots caps how many calls run at once on the model (others wait).
func WithParallelSlots(n int) LoadOption { return func(c *LoadConfig) { c.ParallelSlots = n } }

// WithMaxDeviceMemory sets the device memory the model and its sessions may use, in bytes.
func WithMaxDeviceMemory(bytes uint64) LoadOption {
	return func(c *LoadConfig) { c.MaxDeviceMemory = bytes }
}

// GenerateConfig holds what the generation options set; NewGenerateConfig gives forge's
// defaults.
type GenerateConfig struct {
	MaxTokens          int        // tokens to generate at most; 0: evaluate the prompt only
	Temperature        float32    // 0: greedy (argmax, ties to the lower id)
	TopK               int        // 0: off
	TopP               float32    // 1: off
	MinP               float32    // 0: off
	RepeatPenalty      float32    // 1: off
	RepeatWindow       int        // tokens looked back for the penalty
	Seed               uint64     // the sampler's seed: same seed, device and model, same output
	StopTokens         []int32    // extra ids that end generation (not emitted)
	StopStrings        []string   // texts that end generation (matched across tokens, not emitted)
	IgnoreEOS          bool       // do not stop at the model's end tokens
	AddSpecial         bool       // add the tokens the tokenizer declares (BOS) to a text prompt
	Logits             bool       // Classify: return each prompt's logits
	NoGenerationPrompt bool       // Chat: do not append the assistant's opening
	ThinkingOff        bool       // Chat: enable_thinking=False (Qwen 3; Gemma 4's default)
	ThinkingOn         bool       // Chat: enable_thinking=True (Gemma 4; Qwen 3's default)
	Constraint         Constraint // what the output must match (WithGrammar, WithJSONSchema, ...)
	Tools              []Tool     // Chat, ChatTools, RenderChat: functions the model may call
	StrictToolCalls    bool       // Chat, ChatTools: a call the model opens matches a tool's schema
	RequiredToolCalls  bool       // Chat, ChatTools: the reply is tool calls only
	Lookup             int        // prompt lookup: draft tokens checked a step (0: off, at most 15)
	Draft              *Session   // a draft model's session that drafts instead (WithDraft)

	err        error    // an option's error (two constraints, a schema that does not marshal)
	toolParams []string // check: each tool's parameters as JSON text ("": none)
}

// NewGenerateConfig returns forge's defaults (forge_generate_default_params) with opts
// applied.
func NewGenerateConfig(opts ...GenerateOption) GenerateConfig {
	d := C.forge_generate_default_params()
	c := GenerateConfig{
		MaxTokens:     int(d.max_tokens),
		Temperature:   float32(d.temperature),
		TopK:          int(d.top_k),
		TopP:          float32(d.top_p),
		MinP:          float32(d.min_p),
		RepeatPenalty: float32(d.repeat_penalty),
		RepeatWindow:  int(d.repeat_window),
		Seed:          uint64(d.seed),
		IgnoreEOS:     d.ignore_eos != 0,
		AddSpecial:    d.add_special != 0,
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// GenerateOption sets a GenerateConfig field (functional options, as go-mlx's).
type GenerateOption func(*GenerateConfig)

// WithMaxTokens sets the most tokens to generate (forge's default: 256).
func WithMaxTokens(n int) GenerateOption { return func(c *GenerateConfig) { c.MaxTokens = n } }

// WithTemperature sets the sampling temperature (0, the default: greedy).
func WithTemperature(t float32) GenerateOption { return func(c *GenerateConfig) { c.Temperature = t } }

// WithTopK keeps only the k most likely tokens (0: off).
func WithTopK(k int) GenerateOption { return func(c *GenerateConfig) { c.TopK = k } }

// WithTopP keeps the smallest set of tokens whose probability reaches p (1: off).
func WithTopP(p float32) GenerateOption { return func(c *GenerateConfig) { c.TopP = p } }

// WithMinP drops tokens less likely than p times the most likely one (0: off).
func WithMinP(p float32) GenerateOption { return func(c *GenerateConfig) { c.MinP = p } }

// WithRepeatPenalty penalises the tokens of the last RepeatWindow (default 64) tokens: positive
// logits are divided by penalty, negative ones multiplied (1: off).
func WithRepeatPenalty(penalty float32) GenerateOption {
	return func(c *GenerateConfig) { c.RepeatPenalty = penalty }
}

// WithRepeatWindow sets how many tokens WithRepeatPenalty looks back (at most 1024).
func WithRepeatWindow(n int) GenerateOption { return func(c *GenerateConfig) { c.RepeatWindow = n } }

// WithSeed seeds the sampler.
func WithSeed(seed uint64) GenerateOption { return func(c *GenerateConfig) { c.Seed = seed } }

// WithLookup turns on prompt lookup: up to n tokens a step (1 to 15) are drafted from what
// followed an earlier occurrence of the text's last tokens and checked in one pass. The output
// is what plain decoding draws with the same seed, sooner where it repeats the prompt (an edit
// of a given text); Metrics.DraftTokens and DraftAccepted say how often. Off with a constraint.
func WithLookup(n int) GenerateOption { return func(c *GenerateConfig) { c.Lookup = n } }

// WithDraft makes a session of a smaller model with the same vocabulary draft the tokens
// instead, WithLookup's n a step (4 without it), greedily: the output is the same, sooner the
// more often the draft model guesses this one's next token. The draft session is the call's
// while it runs (another call on it meanwhile gets ErrBusy, and this one fails while that runs).
func WithDraft(draft *Session) GenerateOption { return func(c *GenerateConfig) { c.Draft = draft } }

// WithStopTokens adds token ids that end generation (they are not emitted).
func WithStopTokens(ids ...int32) GenerateOption {
	return func(c *GenerateConfig) { c.StopTokens = append(c.StopTokens, ids...) }
}

// WithStopStrings adds texts that end generation, matched across tokens (not emitted).
func WithStopStrings(s ...string) GenerateOption {
	return func(c *GenerateConfig) { c.StopStrings = append(c.StopStrings, s...) }
}

// WithIgnoreEOS keeps generating past the model's end tokens.
func WithIgnoreEOS() GenerateOption { return func(c *GenerateConfig) { c.IgnoreEOS = true } }

// WithAddSpecial sets whether a text prompt gets the tokens the tokenizer declares (BOS);
// forge's default is true.
func WithAddSpecial(add bool) GenerateOption { return func(c *GenerateConfig) { c.AddSpecial = add } }

// WithLogits makes Classify return each prompt's logits after its last token.
func WithLogits() GenerateOption { return func(c *GenerateConfig) { c.Logits = true } }

// WithoutGenerationPrompt makes Chat and RenderChat leave out the assistant's opening
// (add_generation_prompt=False).
func WithoutGenerationPrompt() GenerateOption {
	return func(c *GenerateConfig) { c.NoGenerationPrompt = true }
}

// WithThinking sets the template's enable_thinking: Qwen 3 thinks unless it is off, Gemma 4
// only when it is on. Without it each template keeps its default.
func WithThinking(on bool) GenerateOption {
	return func(c *GenerateConfig) { c.ThinkingOn, c.ThinkingOff = on, !on }
}

// check returns the error an option left (two constraints, a value that does not marshal)
// before the call does any work, and marshals the tools' parameters.
func (c *GenerateConfig) check() error {
	if c.err != nil {
		return c.err
	}
	if k := &c.Constraint; k.Kind == ConstraintNone && (k.Trigger != "" || k.SampleForced) {
		return invalid("WithConstraintTrigger and WithSampleForced need a constraint (WithGrammar, WithJSONSchema, WithJSONObject, WithChoices)")
	}
	c.toolParams = make([]string, len(c.Tools))
	for i, t := range c.Tools {
		if t.Parameters == nil {
			continue
		}
		text, err := jsonText(t.Parameters)
		if err != nil {
			return invalid(fmt.Sprintf("tool %d (%s): parameters: %v", i, t.Name, err))
		}
		c.toolParams[i] = text
	}
	return nil
}

func (c *GenerateConfig) chatFlags() C.uint32_t {
	var f C.uint32_t
	if c.NoGenerationPrompt {
		f |= C.FORGE_CHAT_NO_GENERATION_PROMPT
	}
	if c.ThinkingOff {
		f |= C.FORGE_CHAT_THINKING_OFF
	}
	if c.ThinkingOn {
		f |= C.FORGE_CHAT_THINKING_ON
	}
	if c.StrictToolCalls {
		f |= C.FORGE_CHAT_TOOL_ARGUMENTS
	}
	if c.RequiredToolCalls {
		f |= C.FORGE_CHAT_TOOL_REQUIRED
	}
	return f
}
