module forge.lthn.ai/core/forge

go 1.23
