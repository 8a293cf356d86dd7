package forge

/*
#include "forge.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"unsafe"
)

// ConstraintKind is forge_constraint_kind: what a constraint's text is.
type ConstraintKind int

// The forge_constraint_kind values of forge.h.
const (
	ConstraintNone       ConstraintKind = 0 // free text
	ConstraintGrammar    ConstraintKind = 1 // a GBNF grammar (llama.cpp's format), from its rule root (WithGrammar)
	ConstraintJSONSchema ConstraintKind = 2 // JSON that validates against a JSON Schema (WithJSONSchema)
	ConstraintJSONObject ConstraintKind = 3 // any JSON object (WithJSONObject)
	ConstraintChoices    ConstraintKind = 4 // exactly one of a list of strings (WithChoices)
)

var constraintNames = [...]string{"none", "grammar", "json schema", "json object", "choices"}

// constraintOptions names the option that sets each kind, for the error of two at once.
var constraintOptions = [...]string{"", "WithGrammar", "WithJSONSchema", "WithJSONObject", "WithChoices"}

// String returns a short lower-case name ("grammar", "json schema").
func (k ConstraintKind) String() string {
	if k >= 0 && int(k) < len(constraintNames) {
		return constraintNames[k]
	}
	return "unknown"
}

// Constraint is forge_constraint: what the output of Generate, Chat, BatchGenerate and Classify
// must match. forge compiles it once a call into a byte automaton over the vocabulary and, at
// each token, allows exactly the tokens whose bytes the automaton can take next:
//
//   - sampling draws from the allowed tokens' distribution, renormalized, then the usual filters
//     (llama.cpp's order: the grammar first); greedy takes the highest-logit allowed token.
//   - where the grammar allows one byte at a time (a property name, "}"), that text is written
//     as the tokenizer's own tokens without sampling (Metrics.ForcedTokens), unless SampleForced.
//   - when the grammar is matched and nothing may follow, generation stops (StopConstraint);
//     where it may end or go on, the model's end token is allowed. Max tokens, a full context,
//     stop strings, breaking out of the loop and cancellation still stop it, which leaves a
//     prefix of a match (Metrics.ConstraintComplete false). The output never leaves the
//     grammar.
//   - a Trigger makes it lazy: the text is free until the trigger appears in it; what follows
//     (up to 16 white-space bytes first) must match, and once matched the text is free again
//     until the next trigger. Chat sets the thinking's end ("</think>") as the trigger of a
//     thinking reply by itself.
//
// The options set it: WithGrammar, WithJSONSchema, WithJSONObject or WithChoices (one of them a
// call: two kinds fail the call with StatusInvalidArgument naming both), with
// WithConstraintTrigger and WithSampleForced.
type Constraint struct {
	Kind         ConstraintKind
	Text         string   // ConstraintGrammar: the GBNF; ConstraintJSONSchema: the schema as JSON text
	Choices      []string // ConstraintChoices: the strings (UTF-8)
	Trigger      string   // "": the constraint holds from the first byte; else it starts after this text
	SampleForced bool     // sample the text the grammar forces too (default: written without sampling)
}

func invalid(msg string) error { return &Error{Status: StatusInvalidArgument, Message: msg} }

// constrain sets the constraint's kind and text; another kind already set is the call's error.
func (c *GenerateConfig) constrain(kind ConstraintKind, text string, choices []string) {
	if old := c.Constraint.Kind; old != ConstraintNone && old != kind && c.err == nil {
		c.err = invalid(fmt.Sprintf("two constraints: %s and %s (a call takes one)",
			constraintOptions[old], constraintOptions[kind]))
	}
	c.Constraint.Kind, c.Constraint.Text, c.Constraint.Choices = kind, text, choices
}

// WithGrammar constrains the output to the text a GBNF grammar matches (llama.cpp's format,
// starting at rule root). A grammar error fails the call with StatusInvalidArgument naming the
// line, column and rule; left recursion is refused, and hostile grammars meet limits
// (StatusLimit).
func WithGrammar(gbnf string) GenerateOption {
	return func(c *GenerateConfig) { c.constrain(ConstraintGrammar, gbnf, nil) }
}

// WithJSONSchema constrains the output to JSON that validates against schema: JSON text as a
// string, []byte or json.RawMessage, or any other value, which encoding/json marshals (a struct,
// a map[string]any: its keys come out sorted, and properties are generated in the schema's
// order). docs/features.md lists the keywords forge enforces; any other validation keyword fails
// the call with StatusUnsupported naming it (never silently ignored), and a value that does not
// marshal fails it with StatusInvalidArgument.
func WithJSONSchema(schema any) GenerateOption {
	return func(c *GenerateConfig) {
		text, err := jsonText(schema)
		if err != nil && c.err == nil {
			c.err = invalid("WithJSONSchema: " + err.Error())
		}
		c.constrain(ConstraintJSONSchema, text, nil)
	}
}

// WithJSONObject constrains the output to one JSON object (any).
func WithJSONObject() GenerateOption {
	return func(c *GenerateConfig) { c.constrain(ConstraintJSONObject, "", nil) }
}

// WithChoices constrains the output to exactly one of choices. Classify then reports which one
// the model writes (ClassifyResult.Choice).
func WithChoices(choices ...string) GenerateOption {
	return func(c *GenerateConfig) { c.constrain(ConstraintChoices, "", append([]string(nil), choices...)) }
}

// WithConstraintTrigger makes the constraint lazy: the text is free until trigger appears in it
// (a tool call's opener, Qwen 3's "</think>"), and what follows must match. Classify refuses a
// trigger (it draws one token).
func WithConstraintTrigger(trigger string) GenerateOption {
	return func(c *GenerateConfig) { c.Constraint.Trigger = trigger }
}

// WithSampleForced samples the text the constraint forces (by default it is written as the
// tokenizer's tokens of it without sampling, all in one step).
func WithSampleForced() GenerateOption {
	return func(c *GenerateConfig) { c.Constraint.SampleForced = true }
}

// jsonText returns v as JSON text: a string, []byte or json.RawMessage as it is, any other
// value as encoding/json marshals it.
func jsonText(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	case json.RawMessage:
		return string(x), nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// constraint returns cfg's constraint in C memory, or nil for none.
func (a *cmem) constraint(k *Constraint) *C.forge_constraint {
	if k.Kind == ConstraintNone {
		return nil
	}
	p := (*C.forge_constraint)(a.alloc(C.sizeof_forge_constraint))
	p.struct_size = C.sizeof_forge_constraint
	p.kind = C.forge_constraint_kind(k.Kind)
	p.text, p.text_len = a.str(k.Text), C.size_t(len(k.Text))
	if n := len(k.Choices); n > 0 {
		strs := (**C.char)(a.alloc(uintptr(n) * unsafe.Sizeof((*C.char)(nil))))
		for i, s := range k.Choices {
			unsafe.Slice(strs, n)[i] = a.str(s)
		}
		p.choices, p.n_choices = strs, C.int(n)
	}
	if k.Trigger != "" {
		p.trigger = a.str(k.Trigger)
	}
	p.sample_forced = cbool(k.SampleForced)
	return p
}
