package forge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	forge "forge.lthn.ai/core/forge/bindings/go"
)

// Greedy generation from the bundled model: the story is the same on every device.
func Example() {
	m, err := forge.LoadModel(modelPath, forge.WithContextLen(512))
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	fmt.Print("Once upon a time")
	for tok := range m.Generate(context.Background(), "Once upon a time", forge.WithMaxTokens(16)) {
		fmt.Print(tok.Text)
	}
	fmt.Println()
	if err := m.Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(m.Metrics().StopReason, m.Info().VocabSize)
	// Output:
	// Once upon a time, there was a little girl named Lily. She loved to play
	// max tokens 512
}

// Classify gives each prompt's greedy next token in one batched pass.
func ExampleModel_Classify() {
	m, err := forge.LoadModel(modelPath)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	res, err := m.Classify(context.Background(), []string{"Once upon a", "Lily and"})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range res {
		fmt.Printf("%q\n", r.Token.Text)
	}
	// Output:
	// " time"
	// " T"
}

// The package in one example: load, stream, metrics, classify, batch generation, chat and LoRA
// training. bindings/go/README.md shows the lines between docs:begin and docs:end
// (tests/test_docs.cpp checks that it does).
func Example_tour() {
	dir, err := os.MkdirTemp("", "forge-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// docs:begin tour
	ctx := context.Background()
	m, err := forge.LoadModel(modelPath, forge.WithContextLen(512)) // a .gguf file or a safetensors directory
	if err != nil {
		log.Fatal(err) // an *forge.Error: errors.Is(err, forge.StatusIO) for a missing file
	}
	defer m.Close()

	// Generate streams as an iter.Seq: break, or cancelling ctx, stops before the next token.
	prompt := "Once upon a time"
	fmt.Print(prompt)
	for tok := range m.Generate(ctx, prompt, forge.WithMaxTokens(16)) { // greedy unless WithTemperature
		fmt.Print(tok.Text) // tok.ID is its id
	}
	fmt.Println()
	if err := m.Err(); err != nil { // nil after a normal stop, ctx.Err() after a cancellation
		log.Fatal(err)
	}
	met := m.Metrics() // and the time to first token, prefill and decode tokens/s, peak device memory
	fmt.Println(met.StopReason, met.GeneratedTokens, m.Info().Architecture)

	// One batched forward pass, no decode loop: each prompt's greedy next token.
	res, err := m.Classify(ctx, []string{"Once upon a", "Lily and"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q %q\n", res[0].Token.Text, res[1].Token.Text)

	// Several prompts decoded together; each result equals Generate of its prompt alone.
	done, err := m.BatchGenerate(ctx, []string{"Lily", "Tom"}, forge.WithMaxTokens(6))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q %q\n", done[0].Text, done[1].Text)

	// Chat renders the model's own template (Llama 3, ChatML, Gemma) and streams the reply.
	for tok := range m.Chat(ctx, []forge.Message{{Role: "user", Content: "Hi"}}) {
		fmt.Print(tok.Text)
	}
	fmt.Println(errors.Is(m.Err(), forge.StatusUnsupported)) // stories260K has no chat template

	// LoRA fine-tuning on the device, the base weights frozen; the adapter loads with WithAdapterPath.
	tr, err := m.NewTrainer(forge.WithRank(8, 16), forge.WithTargets("all"), forge.WithLearningRate(1e-2))
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	ids, _ := m.Tokenize("Once upon a time, there was a girl named Zora.", true)
	batch := forge.TrainBatch{Tokens: [][]int32{ids}} // Labels and Mask are optional
	before, counted, _ := tr.Eval(batch)
	for i := 0; i < 10; i++ {
		if _, err := tr.Step(batch); err != nil { // TrainStats: Loss, Tokens, GradNorm, LR, Step, ...
			log.Fatal(err)
		}
	}
	after, _, _ := tr.Eval(batch)
	fmt.Println(counted, after < before/2)
	if err := tr.Save(filepath.Join(dir, "zora-adapter"), forge.AdapterPEFT); err != nil { // or AdapterMLX
		log.Fatal(err)
	}
	// docs:end tour

	// Output:
	// Once upon a time, there was a little girl named Lily. She loved to play
	// max tokens 16 llama
	// " time" " T"
	// " and Tom were play" " and Lily were playing"
	// true
	// 17 true
}

// Structured output: a JSON Schema makes the output JSON that validates against it (here on
// the bundled story model, greedy). bindings/go/README.md shows the lines between docs:begin and
// docs:end.
func ExampleWithJSONSchema() {
	m, err := forge.LoadModel(modelPath)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	// docs:begin schema
	// The schema: JSON text, or any value encoding/json marshals; WithGrammar (GBNF),
	// WithJSONObject and WithChoices are the other constraints.
	schema := `{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
		"age": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["name", "age"],
		"additionalProperties": false}`
	var text strings.Builder
	for tok := range m.Generate(ctx, "Lily's profile:", forge.WithJSONSchema(schema), forge.WithMaxTokens(64)) {
		text.WriteString(tok.Text)
	}
	if err := m.Err(); err != nil { // a schema keyword forge does not enforce: StatusUnsupported naming it
		log.Fatal(err)
	}
	// ConstraintComplete: the output matches whole (else max tokens cut it: a prefix of a match).
	if met := m.Metrics(); met.ConstraintComplete {
		var profile struct {
			Name string
			Age  int
		}
		if err := json.Unmarshal([]byte(text.String()), &profile); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s\n%+v (%v, %d tokens forced)\n", text.String(), profile, met.StopReason, met.ForcedTokens)
	}
	// docs:end schema

	// Output:
	// { "name" : "I'm sorry," , "age" : 20 }
	// {Name:I'm sorry, Age:20} (constraint, 8 tokens forced)
}

// A tool call: the model (a Llama 3.1+ or Qwen 3 checkpoint: the bundled one has no chat
// template) gets a function, calls it, and answers from its result. Compiled, not run.
// bindings/go/README.md shows the lines between docs:begin and docs:end.
func ExampleModel_ChatTools() {
	m, err := forge.LoadModel("models/Qwen3-0.6B")
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	// docs:begin tools
	weather := forge.Tool{
		Name:        "get_weather",
		Description: "Current weather in a city.",
		Parameters: map[string]any{"type": "object", "required": []string{"city"},
			"properties": map[string]any{"city": map[string]any{"type": "string"}}}, // or JSON text
	}
	chat := []forge.Message{{Role: "user", Content: "What's the weather in Paris?"}}
	// WithRequiredToolCalls: the reply is calls only, each matching its tool's schema
	// (WithStrictToolCalls: the model may answer in text, and a call it opens matches).
	reply, err := m.ChatTools(ctx, chat, forge.WithTools(weather), forge.WithRequiredToolCalls())
	if err != nil {
		log.Fatal(err)
	}
	chat = append(chat, reply.Message()) // the assistant's turn, its calls included
	for _, call := range reply.ToolCalls {
		var args struct{ City string }
		if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil {
			log.Fatal(err)
		}
		result := fmt.Sprintf(`{"city": %q, "celsius": 21}`, args.City) // what call.Name returns
		chat = append(chat, forge.Message{Role: "tool", Content: result})
	}
	reply, err = m.ChatTools(ctx, chat, forge.WithTools(weather))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(reply.Content) // the answer; RenderChat(chat, forge.WithTools(weather)) shows the prompt
	// docs:end tools
}
