"""Sources of the driver scripts that tests kill with SIGKILL mid-run (the in-flight tests of
`toolgym eval --save-in-flight` and `GRPOConfig.keep_in_flight`): an environment whose reward
counts every answer it heard, and a scripted model that kills its own process at a given
generation and logs every other one."""

HEARD_ENV = """
import toolgym


class Heard(toolgym.Environment):
    def reset(self, **row):
        self.heard = []
        self.reward = 0.0

    def user_turn(self, answer):
        self.heard.append(answer)
        self.reward = float(len(self.heard))  # every answer of the episode, before a restart too
        return "Go on."
"""

DYING_MODEL = """
import os, signal

from toolgym.testing import tiny_tokenizer

tokenizer = tiny_tokenizer()
calls = []


def script(prompt_ids):
    # kill_at and calls_file: set by the driver from its arguments
    calls.append(1)
    if len(calls) == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)  # as a lost machine would
    with open(calls_file, "a") as file:
        file.write("call\\n")
    return tokenizer.encode("x" * (len(calls) % 3 + 1) + "<|im_end|>", add_special_tokens=False)
"""
