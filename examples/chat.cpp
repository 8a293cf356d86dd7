// chat.cpp: forge from C++ with nothing but forge.h: load a model, stream a story, then hold a
// two-turn chat when the model has a chat template. Objects are owned by std::unique_ptr, so
// every return path frees them. `make` builds it (build/example_chat); CI builds it again
// against an installed forge (tools/check_install.sh).
//
//   example_chat [MODEL] [PROMPT]
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "forge.h"

struct ModelFree { void operator()(forge_model *m) const { forge_model_free(m); } };
struct SessionFree { void operator()(forge_session *s) const { forge_session_free(s); } };
using Model = std::unique_ptr<forge_model, ModelFree>;
using Session = std::unique_ptr<forge_session, SessionFree>;

// forge calls this once per generated token with the text it completes; user_data is the
// std::string that collects the reply. Return 0 to go on, non-zero to stop.
static int stream_token(void *user_data, int32_t, const char *text, size_t len) {
    static_cast<std::string *>(user_data)->append(text, len);
    std::fwrite(text, 1, len, stdout);
    std::fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/stories260K/stories260K.gguf";
    std::string prompt = argc > 2 ? argv[2] : "Once upon a time";

    forge_model *raw_model = nullptr;
    forge_status st = forge_model_load(path, nullptr, &raw_model);
    Model model(raw_model); // a failed load still returns a model holding the message
    if (st != FORGE_OK) {
        std::fprintf(stderr, "%s: %s\n", forge_status_name(st), forge_model_errmsg(model.get()));
        return 1;
    }
    forge_session *raw_session = nullptr;
    if ((st = forge_session_create(model.get(), nullptr, &raw_session)) != FORGE_OK) {
        std::fprintf(stderr, "%s: %s\n", forge_status_name(st), forge_model_errmsg(model.get()));
        return 1;
    }
    Session session(raw_session);

    // Stream: greedy, 48 tokens at most.
    std::string reply;
    forge_generate_params params = forge_generate_default_params();
    params.max_tokens = 48;
    params.on_token = stream_token;
    params.user_data = &reply;
    forge_metrics metrics{};
    metrics.struct_size = sizeof metrics; // structs forge fills say their size (forge.h)
    std::fputs(prompt.c_str(), stdout);
    if ((st = forge_generate(session.get(), prompt.data(), prompt.size(), &params, &metrics)) != FORGE_OK) {
        std::fprintf(stderr, "\n%s: %s\n", forge_status_name(st), forge_session_errmsg(session.get()));
        return 1;
    }
    std::printf("\n%d tokens, %.1f tokens/s\n", metrics.generated_tokens, metrics.decode_tok_s);

    // Chat: the whole conversation each turn (role, text); the prompt cache prefills only the new turn.
    std::vector<std::pair<std::string, std::string>> conversation = {{"system", "You are a storyteller."},
                                                                     {"user", "Tell me a story about a cat."}};
    std::vector<forge_chat_message> chat; // points into conversation: rebuilt after every change
    auto rebuild = [&] {
        chat.clear();
        for (auto &[role, text] : conversation) {
            forge_chat_message msg{}; // fields a newer forge.h adds (tool calls) stay zero
            msg.struct_size = sizeof msg;
            msg.role = role.c_str();
            msg.content = text.c_str();
            chat.push_back(msg);
        }
    };
    rebuild();
    size_t need = 0;
    char probe[1];
    if (forge_chat_render(model.get(), chat.data(), (int)chat.size(), 0, probe, sizeof probe, &need) == FORGE_ERR_UNSUPPORTED) {
        std::printf("(no chat template: %s)\n", forge_model_errmsg(model.get()));
        return 0;
    }
    for (int turn = 0; turn < 2; turn++) {
        std::printf("user: %s\nassistant: ", conversation.back().second.c_str());
        reply.clear();
        rebuild();
        if ((st = forge_chat(session.get(), chat.data(), (int)chat.size(), 0, &params, &metrics)) != FORGE_OK) {
            std::fprintf(stderr, "\n%s: %s\n", forge_status_name(st), forge_session_errmsg(session.get()));
            return 1;
        }
        std::printf("\n[%d prompt tokens, %d of them from the cache]\n", metrics.prompt_tokens, metrics.cached_tokens);
        conversation.push_back({"assistant", reply});
        conversation.push_back({"user", "Tell me another."});
    }
    return 0;
}
