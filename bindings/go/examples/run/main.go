// Command run streams a story from forge's bundled model (or a model given as the first
// argument) with the Go binding, then prints the generation's metrics and tries a chat:
//
//	make lib
//	go run ./bindings/go/examples/run [MODEL] [PROMPT]
//
// Without MODEL it looks for models/stories260K/stories260K.gguf in the current directory and
// its parents, so it runs from anywhere in the checkout.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"

	forge "forge.lthn.ai/core/forge/bindings/go"
)

const bundled = "models/stories260K/stories260K.gguf"

// findBundled returns the bundled model's path, searching up from the working directory.
func findBundled() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, bundled)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found above the working directory: pass a model path", bundled)
		}
		dir = parent
	}
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		os.Exit(1)
	}
}

func run() error {
	path, prompt := "", "Once upon a time"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	if len(os.Args) > 2 {
		prompt = os.Args[2]
	}
	if path == "" {
		p, err := findBundled()
		if err != nil {
			return err
		}
		path = p
	}
	// Ctrl-C cancels the generation: the loop ends and Err returns context.Canceled.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	m, err := forge.LoadModel(path, forge.WithContextLen(512))
	if err != nil {
		return err
	}
	defer m.Close()
	info := m.Info()
	fmt.Fprintf(os.Stderr, "%s: %s, %d layers, vocab %d, on %s\n", info.Name, info.Architecture, info.NumLayers,
		info.VocabSize, info.DeviceName)

	fmt.Print(prompt)
	for tok := range m.Generate(ctx, prompt, forge.WithMaxTokens(64)) {
		fmt.Print(tok.Text)
	}
	fmt.Println()
	if err := m.Err(); err != nil {
		return err
	}
	met := m.Metrics()
	fmt.Printf("[%d prompt tokens, %d generated, %.0f tokens/s prefill, %.0f tokens/s decode, stop: %s]\n",
		met.PromptTokens, met.GeneratedTokens, met.PrefillTokensPerSec, met.DecodeTokensPerSec, met.StopReason)

	// Chat needs a model with a chat template (Llama 3, Qwen, Gemma); stories260K has none.
	msgs := []forge.Message{{Role: "user", Content: "What is a story?"}}
	fmt.Println("user: " + msgs[0].Content)
	fmt.Print("assistant: ")
	for tok := range m.Chat(ctx, msgs, forge.WithMaxTokens(32)) {
		fmt.Print(tok.Text)
	}
	fmt.Println()
	if err := m.Err(); err != nil {
		if errors.Is(err, forge.StatusUnsupported) {
			fmt.Println("(no chat template: " + err.Error() + ")")
			return nil
		}
		return err
	}
	return nil
}
