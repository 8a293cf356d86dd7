package forge_test

import (
	"context"
	"fmt"
	"log"

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
