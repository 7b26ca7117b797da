"""Images in tool results, for models that see them (Qwen-VL family processors).

A tool that returns content blocks with images (`toolgym.envs.tools.image_blocks`) gives its
tool message `content_blocks`: text and image blocks in order, each image a data URL. For a
template that renders images, `template_content` turns them into the blocks the template
reads (`{"type": "image"}` where the picture goes), so the rendered text holds one
placeholder token per image; `VisionInputs.expand` widens each placeholder to the image's
patch count, as the model's own processor would, and `VisionInputs.model_inputs` gives the
pixel inputs its forward pass takes with those ids: the same for generation and for the
update, so the model is trained on what it saw.

Supported: image processors that report each image's patch grid (`image_grid_thw`) and merge
`merge_size` x `merge_size` patches into one token: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
from collections.abc import Iterator
from typing import Any

import torch

MAX_IMAGE_PIXELS = 16 * 2**20
"""The largest image (width x height) decoded; bigger ones are refused before decoding."""


class VisionError(ValueError):
    """Images cannot reach this model: an image processor toolgym does not know, or ids whose
    image placeholders do not match the images."""


def tool_images(messages: list[dict[str, Any]]) -> list[str]:
    """The images of `messages`' content blocks, in order (data URLs)."""
    return [
        block["image"]
        for message in messages
        for block in message.get("content_blocks") or ()
        if block["type"] == "image"
    ]


def unseen_images() -> str:
    """Why a tool result's images cannot reach the model (the episode ends `env_error`)."""
    return (
        "a tool returned an image, but this agent renders tool results as text: give the "
        "model's processor (with its image processor) as the tokenizer and generate with the "
        "transformers engine (engine='hf') for a Qwen-VL family model"
    )


def template_content(message: dict[str, Any]) -> dict[str, Any]:
    """`message` as a template reads it: its `content_blocks`, if any, as the content (text
    blocks, and `{"type": "image"}` where each image goes)."""
    if "content_blocks" not in message:
        return message
    converted = {k: v for k, v in message.items() if k != "content_blocks"}
    converted["content"] = [
        {"type": "text", "text": b["text"]} if b["type"] == "text" else {"type": "image"}
        for b in message["content_blocks"]
    ]
    return converted


def decode_image(url: str) -> Any:
    """A data URL's image as an RGB PIL image (its size checked before the pixels are read)."""
    from PIL import Image

    data = base64.b64decode(url.split(",", 1)[1], validate=True)
    # raster formats only: PIL would hand others (EPS: Ghostscript) to outside programs
    image = Image.open(io.BytesIO(data), formats=["PNG", "JPEG", "WEBP", "GIF"])
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise VisionError(f"an image of {image.width} x {image.height} is too large to decode")
    return image.convert("RGB")


class VisionInputs:
    """The image side of a Qwen-VL-family model: placeholder expansion and pixel inputs.

    Args:
        image_processor: The model's transformers image processor (its processor's
            `image_processor`).
        image_token_id: The placeholder token (the model config's `image_token_id`).
    """

    def __init__(self, image_processor: Any, image_token_id: int) -> None:
        merge = getattr(image_processor, "merge_size", None)
        if not isinstance(merge, int) or not hasattr(
            image_processor, "get_number_of_image_patches"
        ):
            raise VisionError(
                f"{type(image_processor).__name__}: toolgym renders images for Qwen-VL family "
                "image processors only (a patch grid and merge_size)"
            )
        self.image_processor, self.image_token_id = image_processor, image_token_id
        self.merge = merge
        # an update reads a micro-batch's pixels two or three times (old, reference, new)
        self._processed = functools.lru_cache(maxsize=4)(self._process)

    @classmethod
    def of(cls, processor: Any, model: Any) -> VisionInputs | None:
        """For a processor (an object with `tokenizer` and `image_processor`, as transformers'
        processors are) and its model; None for a plain tokenizer."""
        if not hasattr(processor, "image_processor"):
            return None
        config = getattr(model, "config", None)
        token = getattr(config, "image_token_id", None)
        if token is None:
            raise VisionError(f"{type(model).__name__}'s config names no image_token_id")
        return cls(processor.image_processor, int(token))

    def _pixels(self, images: list[str]) -> dict[str, torch.Tensor]:
        return self._processed(tuple(images))

    def _process(self, images: tuple[str, ...]) -> dict[str, torch.Tensor]:
        decoded = [decode_image(url) for url in images]
        return dict(self.image_processor(images=decoded, return_tensors="pt"))

    def expand(self, ids: list[int], images: list[str]) -> list[int]:
        """`ids` with the i-th image placeholder repeated as many times as image i has merged
        patches (its tokens in the model's sequence)."""
        placeholders = ids.count(self.image_token_id)
        if placeholders != len(images):
            raise VisionError(
                f"the template wrote {placeholders} image placeholders for {len(images)} images"
            )
        if not images:
            return list(ids)
        counts = iter(self._token_counts(images))
        expanded: list[int] = []
        for token in ids:
            expanded.extend([token] * next(counts) if token == self.image_token_id else [token])
        return expanded

    def _token_counts(self, images: list[str]) -> list[int]:
        """Each image's tokens from its size alone (its pixels are processed where the model
        runs on them)."""
        count = self.image_processor.get_number_of_image_patches
        sizes = [decode_image(url).size for url in images]
        return [count(height, width, {}) // self.merge**2 for width, height in sizes]

    def model_inputs(self, input_ids: torch.Tensor, images: list[str]) -> dict[str, Any]:
        """What the model's forward takes besides `input_ids` for rows holding `images` (in
        row order): pixel values, the patch grids and the token types of its position ids."""
        if not images:
            return {}
        inputs = dict(self._pixels(images))  # (a copy: the processed pixels are cached)
        inputs["mm_token_type_ids"] = (input_ids == self.image_token_id).long()
        return {k: v.to(input_ids.device) for k, v in inputs.items()}


@contextlib.contextmanager
def images_bound(
    model: Any, vision: VisionInputs | None, input_ids: torch.Tensor, images: list[str]
) -> Iterator[None]:
    """While the block runs, every forward pass of `model` over `input_ids` (the batch's
    shape: not a probe of a few of its tokens) also gets the pixel inputs of `images`, so the
    loss code, which passes ids and mask only, runs the model as generation did."""
    if vision is None or not images:
        yield
        return
    extra = vision.model_inputs(input_ids, images)

    def add_pixels(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        ids = kwargs.get("input_ids")
        if ids is None or ids.shape != input_ids.shape:
            return None  # another call (a probe of a few tokens): as it is
        return args, {**kwargs, **extra}

    inner = model
    while hasattr(inner, "module"):  # accelerate's and DDP's wrappers
        inner = inner.module
    handle = inner.register_forward_pre_hook(add_pixels, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
