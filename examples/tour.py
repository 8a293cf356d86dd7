"""tour.py: the forge Python package in one page (bindings/python/README.md shows this file; the
tests run it from a directory holding models/, where it writes zora-adapter/)."""
import forge

with forge.Model("models/stories260K/stories260K.gguf") as model:  # device=, adapter=, exact=
    print(model.info.architecture, model.info.n_params, model.special_tokens.bos)
    ids = model.tokenize("Once upon a time", add_special=True)      # [1, 403, 407, 261, 378]
    assert model.detokenize(ids, skip_special=True) == "Once upon a time"
    with model.session(n_ctx=512) as session:
        stream = session.generate("Once upon a time", max_tokens=64, temperature=0.8, seed=1)
        for i, token in enumerate(stream):
            print(token, end="")                                     # a str, with token.id
            if i == 20:
                break                 # stops before the next token; the session stays usable
        print("\n" + str(session.metrics.stop_reason))              # callback (an IntEnum: == 5)
        print(session.classify(["Lily", "Tom"])[0].text)             # one batched pass, no decode
        for done in session.batch_generate(["Lily", "Tom"], max_tokens=16):
            print(done.text, done.metrics.decode_tok_s)
        # session.chat([{"role": "user", "content": "Hi"}]) streams a reply the same way, on a
        # model with a chat template (Llama 3, ChatML, Gemma)
    # LoRA fine-tuning (forge_trainer): a batch is a list of str or of token id lists
    with model.trainer(rank=8, targets="all", lr=1e-2, max_batch=4, max_seq=128) as trainer:
        for step in range(10):
            stats = trainer.step(["Once upon a time, there was a girl named Zora."] * 4)
        print(stats.loss, trainer.eval(["Zora liked to draw."]))     # (loss, counted targets)
        trainer.save("zora-adapter")           # PEFT files; format="mlx" for mlx-lm's
