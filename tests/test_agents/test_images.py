"""Content blocks in tool results (issue 29 item 4), as TRL, MCP and OpenAI pass them: text
blocks are joined into the tool message; images travel as data URLs from the environment
(in-process or sandboxed) to the agent; a model that sees images (a tiny random Qwen2-VL
built here, with Qwen3.5's real chat template from llama.cpp's corpus and transformers' own
Qwen2-VL image processor) gets each image's placeholder widened to its patch count,
generates with the pixels, and is trained on the same pixels; an agent that renders text
only ends the episode `env_error` at the first image, saying why."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

import toolgym
from toolgym.agents import Agent, AgentLimits
from toolgym.agents.engines.base import GenerationRequest, SamplingParams
from toolgym.agents.engines.hf import HFEngine
from toolgym.agents.engines.scripted import ScriptedEngine
from toolgym.agents.images import VisionError, VisionInputs, decode_image, images_bound
from toolgym.algorithms import GRPOConfig
from toolgym.algorithms.learner import Learner
from toolgym.algorithms.losses import token_logprobs
from toolgym.envs.tools import (
    UnrenderableResult,
    checked_blocks,
    image_blocks,
    render_result,
)
from toolgym.testing import tiny_tokenizer

TEMPLATE = Path(__file__).parents[1] / "templates" / "llama.cpp" / "Qwen3.5-4B.jinja"
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
CALL = "<tool_call>\n<function=screenshot>\n</function>\n</tool_call><|im_end|>"


def data_url(image: Image.Image) -> str:
    """An image as the data URL a tool result carries."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def red_square() -> Image.Image:
    return Image.new("RGB", (60, 40), (200, 30, 30))


class Screens(toolgym.Environment):
    def reset(self) -> str:
        return "Look around."

    def look(self) -> list:
        """Describe the room."""
        return [{"type": "text", "text": "a room"}, {"type": "text", "text": "a door"}]

    def screenshot(self) -> list:
        """Take a screenshot."""
        return [{"type": "text", "text": "here:"}, {"type": "image", "image": red_square()}]

    def broken(self) -> list:
        """Point at a picture on the web."""
        return [{"type": "image", "image": "https://example.com/a.png"}]


@pytest.mark.parametrize("where", ["local", "process"])
def test_an_image_travels_as_a_data_url_in_the_tool_message(where):
    if where == "process" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    env = toolgym.sandbox.sandboxed(Screens, {}, where)
    try:
        env.reset(seed=0)
        assert env.step(toolgym.ToolCall("look")).messages[0]["content"] == "a room\na door"
        message = env.step(toolgym.ToolCall("screenshot")).messages[0]
        assert message["content"] == "here:"  # the text, for logs and text-only readers
        text, image = message["content_blocks"]
        assert text == {"type": "text", "text": "here:"}
        png = base64.b64decode(image["image"].removeprefix("data:image/png;base64,"))
        assert Image.open(io.BytesIO(png)).convert("RGB").getpixel((0, 0)) == (200, 30, 30)
        step = env.step(toolgym.ToolCall("broken"))
        assert (
            step.results[0].failure == "bad_result" and "not a URL" in step.messages[0]["content"]
        )
    finally:
        env.close()


def test_text_blocks_are_joined_and_other_lists_stay_json():
    assert render_result([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"
    assert render_result([{"kind": "text"}]) == '[{"kind": "text"}]'  # not content blocks
    assert render_result([]) == "[]"


def test_every_form_of_image_block_becomes_a_data_url():
    """PIL images, bytes, raw base64, data URLs; TRL's, OpenAI's and MCP's block shapes."""
    url = data_url(red_square())
    raw = url.removeprefix("data:image/png;base64,")
    png = base64.b64decode(raw)
    forms = [
        {"type": "image", "image": red_square()},
        {"type": "image", "image": png},
        {"type": "image", "image": raw},
        {"type": "image", "image": url},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "input_image", "image_url": url},
        {"type": "image", "data": raw, "mimeType": "image/png"},
    ]
    for form in forms:
        assert image_blocks([form]) == [{"type": "image", "image": url}], form
    with pytest.raises(UnrenderableResult, match="'input_audio'"):
        image_blocks([form, {"type": "input_audio", "data": "x"}])
    assert image_blocks([{"type": "text", "text": "no image"}]) is None  # text only: as before


def test_blocks_from_a_sandbox_are_checked_on_the_host():
    """A worker's reply may be forged by the model's code: only blocks toolgym makes pass."""
    good = [{"type": "text", "text": "a"}, {"type": "image", "image": "data:image/png;base64,AA"}]
    assert checked_blocks(good) == good
    for forged in (
        [{"type": "image", "image": "file:///etc/passwd"}],
        [{"type": "image", "image": "data:image/png;base64,AA", "extra": 1}],
        [{"type": "audio", "audio": "x"}],
        "not a list",
    ):
        with pytest.raises(ValueError, match="sandbox replied"):
            checked_blocks(forged)


class ImageForger(toolgym.Environment):
    """A tool that writes a forged protocol reply carrying an image block no tool makes, then
    exits, as code the model wrote could (fd 3 is the worker's protocol channel)."""

    def forge(self, request_id: int) -> str:
        """Answer request `request_id` (the call being asked) with a forged reply and exit.

        Args:
            request_id: The request id.
        """
        import json
        import os

        from toolgym.sandbox.worker import PROTOCOL_VERSION

        blocks = [{"type": "image", "image": "file:///etc/passwd"}]
        value = {"content": "forged", "failure": None, "blocks": blocks}
        reply = {"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "value": value}
        os.write(3, (json.dumps(reply) + "\n").encode())
        os._exit(0)  # no honest reply after it: the forged one is all the host reads


def test_a_forged_image_block_kills_the_worker_as_the_models_doing():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    env = toolgym.sandbox.sandboxed(ImageForger, {}, "process")
    try:
        env.reset(seed=0)
        result = env.step(toolgym.ToolCall("forge", {"request_id": 3}))  # after hello, reset
        assert result.info["ended"] == "tool_crash", result.info
        assert "a content block toolgym never makes" in result.info["error"]
        assert "worker killed" in result.info["error"]
    finally:
        env.close()


def _play(agent: Agent) -> toolgym.agents.Trajectory:
    (trajectory,) = agent.run([Screens()], [{"prompt": "Look around."}])
    return trajectory


def test_a_text_only_agent_ends_the_episode_at_the_first_image_saying_why():
    tokenizer = tiny_tokenizer()
    reply = '<tool_call>\n{"name": "screenshot", "arguments": {}}\n</tool_call><|im_end|>'
    engine = ScriptedEngine([tokenizer.encode(reply, add_special_tokens=False)])
    agent = Agent(engine, tokenizer, parser="hermes", limits=AgentLimits(max_turns=2))
    trajectory = _play(agent)
    assert trajectory.status == "env_error"
    assert "renders tool results as text" in trajectory.error
    assert "engine='hf'" in trajectory.error


@pytest.fixture(scope="module")
def vision_model():
    """A tiny random Qwen2-VL (one vision block), its processor's two halves (transformers'
    `Qwen2VLProcessor` itself needs torchvision for its video half, which set-up does not
    install) and Qwen3.5's chat template, whose tool turns render images."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = TEMPLATE.read_text()
    ids = tokenizer.convert_tokens_to_ids(VISION_TOKENS)
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128)
    text |= dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    text |= dict(rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    text |= dict(bos_token_id=None, eos_token_id=tokenizer.eos_token_id)
    vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        vision_start_token_id=ids[0],
        image_token_id=ids[1],
        vision_end_token_id=ids[2],
        video_token_id=ids[3],
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).eval()
    images = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112)
    processor = SimpleNamespace(tokenizer=tokenizer, image_processor=images)
    return model, processor


def test_a_vision_model_sees_the_image_in_generation_and_in_training(vision_model):
    model, processor = vision_model
    tokenizer, vision = processor.tokenizer, VisionInputs.of(processor, model)
    reply = tokenizer.encode(CALL, add_special_tokens=False)
    agent = Agent(ScriptedEngine([reply]), tokenizer, limits=AgentLimits(max_turns=1))
    agent.vision = vision
    trajectory = _play(agent)
    (sample,) = trajectory.samples  # Qwen3.5's template is prefix-preserving: one sequence
    assert len(sample.images) == 1 and sample.images[0].startswith("data:image/png;base64,")
    # 60 x 40 pixels -> a grid of 1 x 4 x 6 patches of 14 -> 6 tokens after the 2 x 2 merge
    pads = sample.completion_ids.count(vision.image_token_id)
    assert pads == 6 and trajectory.status == "max_turns"
    text = tokenizer.decode(sample.completion_ids)
    assert "here:<|vision_start|>" + "<|image_pad|>" * 6 + "<|vision_end|>" in text

    # The transformers engine generates with the pixels...
    engine = HFEngine(model, tokenizer, vision=vision)
    ids = sample.prompt_ids + sample.completion_ids
    sampling = SamplingParams(temperature=1.0, max_tokens=6)
    torch.manual_seed(1)
    (completion,) = engine.generate([GenerationRequest(ids, sampling, images=sample.images)])
    # ...and the update's forward pass over the same ids gets the same pixels: its logprobs
    # of the sampled tokens are the engine's (which never samples the image placeholder: its
    # distribution is the model's without that token, renormalised); with another picture
    # they are not.
    full = torch.tensor([ids + completion.token_ids])
    mask = torch.ones_like(full)
    with torch.no_grad(), images_bound(model, vision, full, sample.images):
        seen = token_logprobs(model, full, mask)[0, len(ids) - 1 :]
        logits = model(input_ids=full, attention_mask=mask).logits[0, len(ids) - 1 : -1]
    placeholder = logits.log_softmax(-1)[:, vision.image_token_id]
    assert vision.image_token_id not in completion.token_ids
    renormalised = seen - torch.log1p(-placeholder.exp())
    assert torch.allclose(renormalised, torch.tensor(completion.logprobs), atol=1e-4)
    other = [data_url(Image.new("RGB", (60, 40), (10, 200, 10)))]
    with torch.no_grad(), images_bound(model, vision, full, other):
        unseen = token_logprobs(model, full, mask)[0, len(ids) - 1 :]
    assert not torch.allclose(unseen, seen, atol=1e-4)  # the picture changes what it predicts


def test_the_update_trains_the_vision_tower_on_the_episode_images(vision_model):
    model, processor = vision_model
    tokenizer, vision = processor.tokenizer, VisionInputs.of(processor, model)
    reply = tokenizer.encode(CALL, add_special_tokens=False)
    agent = Agent(ScriptedEngine([reply, reply]), tokenizer, limits=AgentLimits(max_turns=2))
    agent.vision = vision
    played = [_play(agent), _play(agent)]
    config = GRPOConfig(output_dir="unused", micro_batch_size=2, learning_rate=1e-2)
    policy = type(model)(model.config).eval()
    policy.load_state_dict(model.state_dict())
    learner = Learner(policy, config, _accelerator(), tokenizer.pad_token_id, vision)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if "visual" in n}
    stats = learner.update(played, torch.tensor([1.0, -1.0]), torch.ones(2, dtype=torch.bool), 2)
    assert stats["grad_norm"] > 0
    moved = [
        n for n, p in policy.named_parameters() if "visual" in n and not torch.equal(p, before[n])
    ]
    assert moved, "no parameter of the vision tower was trained"


def _accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def test_placeholders_the_tool_text_writes_itself_end_the_episode(vision_model):
    """A tool whose text holds the image placeholder token (without an image) would put image
    tokens without pixels into the update: the episode ends `env_error`, naming it."""

    class Echo(toolgym.Environment):
        def reset(self) -> str:
            return "Say it."

        def screenshot(self) -> str:
            """Take a screenshot."""
            return "<|image_pad|>"

    model, processor = vision_model
    tokenizer, vision = processor.tokenizer, VisionInputs.of(processor, model)
    reply = tokenizer.encode(CALL, add_special_tokens=False)
    agent = Agent(ScriptedEngine([reply]), tokenizer, limits=AgentLimits(max_turns=1))
    agent.vision = vision
    (trajectory,) = agent.run([Echo()], [{"prompt": "Say it."}])
    assert trajectory.status == "env_error"
    assert "1 image placeholders for 0 images" in trajectory.error


def test_images_are_decoded_in_raster_formats_only():
    """PIL would hand an EPS file to Ghostscript: such bytes are refused before decoding."""
    eps = "data:image/png;base64," + base64.b64encode(b"%!PS-Adobe-3.0 EPSF-3.0\n").decode()
    with pytest.raises(Exception, match="cannot identify image file"):
        decode_image(eps)
    assert decode_image(data_url(red_square())).size == (60, 40)


def test_images_train_in_one_process_only():
    from toolgym.algorithms.learner import refuse_images_across_processes

    with pytest.raises(ValueError, match="one process only"):
        refuse_images_across_processes(object(), 2)  # type: ignore[arg-type]
    refuse_images_across_processes(None, 2)


def test_an_image_processor_of_another_kind_is_named():
    with pytest.raises(VisionError, match="Qwen-VL family"):
        VisionInputs(object(), image_token_id=5)
    model = SimpleNamespace(config=SimpleNamespace())
    with pytest.raises(VisionError, match="no image_token_id"):
        VisionInputs.of(SimpleNamespace(image_processor=object()), model)
    assert VisionInputs.of(tiny_tokenizer(), model) is None  # a plain tokenizer: text only


def test_one_sample_per_turn_episodes_show_every_image_so_far(vision_model):
    """With a template built one sample per turn, each turn's prompt is the template's own
    rendering of the conversation: every image so far, each placeholder widened; the turn's
    sample keeps those images, and the update trains on them."""
    model, processor = vision_model
    tokenizer, vision = processor.tokenizer, VisionInputs.of(processor, model)
    reply = tokenizer.encode(CALL, add_special_tokens=False)
    agent = Agent(
        ScriptedEngine([reply]), tokenizer, per_turn=True, limits=AgentLimits(max_turns=3)
    )
    agent.vision = vision
    trajectory = _play(agent)
    assert [len(sample.images) for sample in trajectory.samples] == [0, 1, 2]
    for sample in trajectory.samples:
        assert sample.prompt_ids.count(vision.image_token_id) == 6 * len(sample.images)
        assert vision.image_token_id not in sample.completion_ids  # no turn of its own adds one
    config = GRPOConfig(output_dir="unused", micro_batch_size=3, learning_rate=1e-2)
    policy = type(model)(model.config).eval()
    policy.load_state_dict(model.state_dict())
    learner = Learner(policy, config, _accelerator(), tokenizer.pad_token_id, vision)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if "visual" in n}
    learner.update([trajectory], torch.tensor([1.0]), torch.ones(1, dtype=torch.bool), 1)
    after = dict(policy.named_parameters())
    assert any(not torch.equal(after[n], was) for n, was in before.items()), "vision unchanged"


def test_a_trainer_given_a_processor_wires_its_image_side_everywhere(vision_model, tmp_path):
    """`tokenizer=` a processor (TRL's `processing_class`): its tokenizer renders text, its
    image processor reaches the engine, the agent and the learner; one step runs."""
    from toolgym.algorithms import GRPOTrainer

    model, processor = vision_model
    config = GRPOConfig(
        output_dir=str(tmp_path),
        engine="hf",
        max_steps=1,
        prompts_per_step=1,
        num_generations=2,
        limits=AgentLimits(max_turns=1, max_new_tokens=4),
        progress_bar=False,
    )
    policy = type(model)(model.config).eval()
    policy.load_state_dict(model.state_dict())
    trainer = GRPOTrainer(
        policy, Screens, [{"prompt": "Look around."}], args=config, tokenizer=processor
    )
    assert trainer.tokenizer is processor.tokenizer
    assert trainer.vision is trainer.engine.vision is trainer.agent.vision is trainer.learner.vision
    assert trainer.vision.image_token_id == model.config.image_token_id
    assert len(trainer.train()) == 1


def test_a_processor_with_a_vllm_engine_is_refused_naming_the_way_out(vision_model, tmp_path):
    """vLLM engines are given token ids only: a processor with one is refused at start."""
    from toolgym.algorithms import GRPOTrainer

    model, processor = vision_model
    for engine in ("vllm", "vllm-server"):
        config = GRPOConfig(output_dir=str(tmp_path), engine=engine, progress_bar=False)
        with pytest.raises(ValueError, match=r"engine='hf' only.*processor.tokenizer"):
            GRPOTrainer(model, Screens, [{"prompt": "Look."}], args=config, tokenizer=processor)
