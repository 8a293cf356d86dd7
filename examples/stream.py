"""stream.py: the forge Python package's example: load a model, stream a story, chat.

    FORGE_LIBRARY=build/libforge.so PYTHONPATH=bindings/python python3 examples/stream.py [MODEL] [PROMPT]

MODEL defaults to the bundled stories260K (which has no chat template, so the chat part says
so); pass an instruction-tuned model (Llama 3, Qwen, Gemma) to see it chat. The tests run it.
"""

import sys

import forge

path = sys.argv[1] if len(sys.argv) > 1 else "models/stories260K/stories260K.gguf"
prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time"

with forge.Model(path) as model, model.session(n_ctx=512) as session:
    # Stream: each token is a str (the text it completes) with its id in token.id.
    print(prompt, end="", flush=True)
    stream = session.generate(prompt, max_tokens=64)
    for token in stream:
        print(token, end="", flush=True)
    m = stream.metrics
    print(f"\n{m.generated_tokens} tokens, {m.decode_tok_s:.1f} tokens/s, first after {m.ttft_ms:.1f} ms")

    # Chat: the whole conversation each turn; the session's prompt cache prefills only the new turn.
    messages = [{"role": "system", "content": "You are a storyteller."},
                {"role": "user", "content": "What is a story?"}]
    try:
        model.render_chat(messages)
    except forge.UnsupportedError as e:
        print(f"no chat template: {e.message}")
        sys.exit(0)
    for turn in range(2):
        print(f"user: {messages[-1]['content']}")
        print("assistant: ", end="", flush=True)
        reply = session.chat(messages, max_tokens=32)
        for token in reply:
            print(token, end="", flush=True)
        print(f"\n[{reply.metrics.prompt_tokens} prompt tokens, {reply.metrics.cached_tokens} from the cache]")
        messages += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "Tell me another."}]
