"""Load the embedded model from `$TOOLGYM_CACHE`, as one process of several starting at once.

`--accelerate`: first join the launch's process group (an `Accelerator`), as `toolgym train`
and `bench/sharding.py` do, so `torch.distributed` is initialised while the model is converted.
Prints `loaded <model_type> <parameters> <first weight's sum>`.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    if "--accelerate" in sys.argv:
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        assert accelerator.num_processes > 1, "launch with accelerate launch --num_processes N"
    from toolgym.agents.models import load_model, load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    model = load_model("smollm2-135m")
    assert tokenizer.chat_template and "tools" in tokenizer.chat_template
    weight = next(iter(model.parameters()))
    print(f"loaded {model.config.model_type} {model.num_parameters()} {float(weight.sum()):.6f}")
