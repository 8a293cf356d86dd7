package forge

/*
#include "forge.h"
*/
import "C"

import (
	"context"
	"unsafe"
)

// Tool is forge_tool: a function the model may call (WithTools), rendered into the prompt as
// the model's chat template renders transformers' tools list [{"type": "function", "function":
// {"name", "description", "parameters"}}].
type Tool struct {
	Name        string
	Description string // "": none
	// The arguments' JSON Schema (an object): JSON text as a string, []byte or json.RawMessage,
	// or any other value, which encoding/json marshals; nil or "": none (any JSON object).
	Parameters any
}

// ToolCall is forge_tool_call: a function call an assistant message made, or one that
// ChatTools parsed out of a reply.
type ToolCall struct {
	Name      string // the function's name
	Arguments string // its arguments: a JSON object as text ("": {})
	ID        string // the call's id ("": none); Mistral v0.3 / Nemo need one of 9 characters, as ChatTools gives them
}

// ChatReply is a reply ChatTools parsed (forge_chat_reply): its text and the tool calls in it
// (Llama 3.1+: a reply that is a JSON {"name", "parameters"}, or several separated by ';';
// Qwen 3: <tool_call> blocks of JSON; Qwen 3.5: <tool_call><function=NAME> blocks; Mistral:
// a [TOOL_CALLS] JSON array; Gemma 4: <|tool_call>call:NAME{...} blocks). A call that does not parse stays in the content. Each call has an
// ID: the model's, or 9 letters and digits forge makes from the reply.
type ChatReply struct {
	Text      string     // the whole reply, as generated
	Content   string     // the reply without its tool calls, trimmed
	ToolCalls []ToolCall // the calls; Arguments a compact JSON object
}

// Message returns the reply as the assistant's turn of a conversation (its Content and
// ToolCalls), to send back with the tools' results (role "tool", ToolCallID the call's ID).
func (r ChatReply) Message() Message {
	return Message{Role: "assistant", Content: r.Content, ToolCalls: r.ToolCalls}
}

// WithTools adds functions the model may call. RenderChat renders them as the model's
// template renders tools= (Llama 3.1 / 3.2 / 3.3: in the first user message; Qwen 3, Qwen 3.5:
// a # Tools system block; Mistral v0.3 / Nemo: [AVAILABLE_TOOLS] before the last user message;
// Gemma 4: <|tool> declarations in the system turn; other families fail with StatusUnsupported
// naming the family), Chat
// streams the reply to a conversation rendered with them, and ChatTools parses the calls out of
// the reply. A tool without a name, or parameters that are not a JSON object, fail the call
// with StatusInvalidArgument.
func WithTools(tools ...Tool) GenerateOption {
	return func(c *GenerateConfig) { c.Tools = append(c.Tools, tools...) }
}

// WithStrictToolCalls makes a tool call the model opens name one of the tools and match its
// parameters' JSON Schema (a constraint from the call's opener on, for the families whose calls
// forge constrains: docs/features.md; a schema keyword it cannot enforce there fails the call
// with StatusUnsupported naming it). It replaces WithGrammar and the other constraints, which
// must then be left out (StatusInvalidArgument).
func WithStrictToolCalls() GenerateOption {
	return func(c *GenerateConfig) { c.StrictToolCalls = true }
}

// WithRequiredToolCalls makes the reply tool calls only, each naming one of the tools and
// matching its parameters' JSON Schema (constrained from the reply's start, after the thinking
// of a thinking reply; Llama 3.1+: one call, as its template renders one a message). As
// WithStrictToolCalls, it takes no other constraint.
func WithRequiredToolCalls() GenerateOption {
	return func(c *GenerateConfig) { c.RequiredToolCalls = true }
}

func (c *GenerateConfig) usesTools() bool {
	return len(c.Tools) > 0 || c.StrictToolCalls || c.RequiredToolCalls
}

// tools returns cfg's tools in C memory (nil for none); check has marshalled their parameters.
func (a *cmem) tools(c *GenerateConfig) *C.forge_tool {
	n := len(c.Tools)
	if n == 0 {
		return nil
	}
	p := (*C.forge_tool)(a.alloc(uintptr(n) * C.sizeof_forge_tool))
	for i, t := range c.Tools {
		ct := &unsafe.Slice(p, n)[i]
		ct.struct_size = C.sizeof_forge_tool
		ct.name = a.str(t.Name)
		if t.Description != "" {
			ct.description = a.str(t.Description)
		}
		if c.toolParams[i] != "" {
			ct.parameters = a.str(c.toolParams[i])
		}
	}
	return p
}

// chat runs forge_chat, or forge_chat_tools when cfg has tools or tool options or a reply is
// wanted.
func (a *cmem) chat(cs *C.forge_session, messages []Message, c *GenerateConfig, p *C.forge_generate_params,
	reply *C.forge_chat_reply, met *C.forge_metrics) C.forge_status {
	msgs, n := a.messages(messages), C.int(len(messages))
	if reply == nil && !c.usesTools() {
		return C.forge_chat(cs, msgs, n, c.chatFlags(), p, met)
	}
	return C.forge_chat_tools(cs, msgs, n, a.tools(c), C.int(len(c.Tools)), c.chatFlags(), p, reply, met)
}

// chatReply copies a forge_chat_reply out of the session's memory.
func chatReply(r *C.forge_chat_reply) ChatReply {
	out := ChatReply{Text: C.GoStringN(r.text, C.int(r.text_len)), Content: C.GoStringN(r.content, C.int(r.content_len))}
	if n := int(r.n_tool_calls); n > 0 {
		names, args, ids := unsafe.Slice(r.tool_names, n), unsafe.Slice(r.tool_arguments, n), unsafe.Slice(r.tool_ids, n)
		out.ToolCalls = make([]ToolCall, n)
		for i := range out.ToolCalls {
			out.ToolCalls[i] = ToolCall{Name: C.GoString(names[i]), Arguments: C.GoString(args[i]), ID: C.GoString(ids[i])}
		}
	}
	return out
}

// ChatTools generates the reply to messages as Chat does (WithTools' functions rendered into
// the prompt) and returns it parsed into its content and tool calls. WithRequiredToolCalls makes
// the reply calls only, WithStrictToolCalls makes each call the model opens match a tool's
// schema; without them the model may answer in text or call a tool (parsed either way). Its
// error is returned (Err is not set); Metrics reports the call. When ctx is cancelled the reply
// so far is returned with ctx.Err().
//
// A tool-calling turn: append reply.Message() and each call's result as a Message with role
// "tool" to the conversation, and call ChatTools again.
func (m *Model) ChatTools(ctx context.Context, messages []Message, opts ...GenerateOption) (ChatReply, error) {
	s, err := m.takeSession(false)
	if err != nil {
		return ChatReply{}, err
	}
	defer m.putSession(s, false)
	reply, err := s.ChatTools(ctx, messages, opts...)
	m.setResult(s.Metrics(), nil, false)
	return reply, err
}

// ChatTools is Model.ChatTools on this session; the prompt cache makes a multi-turn chat
// prefill only the new turn.
func (s *Session) ChatTools(ctx context.Context, messages []Message, opts ...GenerateOption) (ChatReply, error) {
	cfg := NewGenerateConfig(opts...)
	var reply ChatReply
	st := &stream{yield: func(Token) bool { return true }}
	met, err := s.run(ctx, &cfg, st, func(cs *C.forge_session, a *cmem, c *GenerateConfig, p *C.forge_generate_params, met *C.forge_metrics) C.forge_status {
		r := (*C.forge_chat_reply)(a.alloc(C.sizeof_forge_chat_reply))
		r.struct_size = C.sizeof_forge_chat_reply
		status := a.chat(cs, messages, c, p, r, met)
		if status == C.FORGE_OK {
			reply = chatReply(r) // the session's strings, valid until its next call
		}
		return status
	})
	s.setResult(met, err, false)
	return reply, err
}
