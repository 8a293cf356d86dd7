package forge_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

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
