"""Images in: what llama.cpp's libmtmd computes from an mmproj GGUF and image bytes, up to the
rows that replace token embeddings in the text model's input.

Stages, one module each:
- decode.py: bytes -> RGB uint8 as llama.cpp's stb_image (jpeg.py: stb's baseline JPEG decoder),
  with a content hash of the pixels (the prefix cache's key) and a pixel limit checked before decoding;
- preprocess.py (+ resize.py, llama.cpp's own kernels): per projector type, the float images
  the encoder sees (bit-identical to llama.cpp's);
- config.py, weights.py, encoder.py, projectors.py: the tower (CLIP/SigLIP ViT) and projector in
  PyTorch float32, every key and tensor read and checked at load;
- layout.py: the text tokens around the image rows, and a prompt of text pieces and images;
- model.py: `load_vision_model` ties them per type (PROJECTOR_KINDS): `plan` an image (its
  positions, no encoder run), `encode` it (EncodedImage: TextSegment and EmbeddingRows).

Supported projector types: idefics3 (SmolVLM), gemma3, mlp (LLaVA-1.5). Layer: uses lamplight.gguf
only; the engine and the server call it.

What the next types need:
- Qwen-VL (qwen2vl / qwen3vl / Qwen 3.5): preprocessing that resizes to multiples of
  patch * merge (2) between --image-min-tokens and --image-max-tokens, patches of two temporal
  frames (a 3-D patch embedding, `v.patch_embd.weight.1`), 2-D rotary position embeddings in the
  tower (no learned position rows) and windowed attention for 2.5, a 2x2 patch merger (+ deepstack
  features for qwen3vl), `<|vision_start|>` / `<|vision_end|>` around the rows. In the text model
  the image rows take *M-RoPE* positions (temporal, height, width sections) and the text after an
  image continues from max position + 1, so the number of positions an image advances is not its
  number of rows: segments would carry per-row (t, y, x) positions, and ForwardBatch would need a
  positions tensor of 3 (or 4) components where the runner's rope reads them.
- Audio (ultravox, qwen2a, voxtral...): `clip.has_audio_encoder` and `clip.audio.*` keys, a
  decode.py counterpart (WAV/MP3 -> 16 kHz mono float, mel spectrogram with the file's filters),
  a conformer/whisper encoder with its own projector; the layout (EmbeddingRows) and splicing stay
  the same, and `/props` modalities would report audio.
"""

from .decode import DEFAULT_MAX_PIXELS, DecodedImage, decode_image
from .errors import ImageError, ImageTooLargeError
from .layout import (EmbeddingRows, ImageRows, TextSegment, assemble_prompt, count_positions,
                     flatten_for_batch)
from .model import PROJECTOR_KINDS, EncodedImage, ImagePlan, VisionModel, load_vision_model

__all__ = [
    "DEFAULT_MAX_PIXELS", "DecodedImage", "EmbeddingRows", "EncodedImage", "ImageError", "ImagePlan", "ImageRows",
    "ImageTooLargeError", "PROJECTOR_KINDS", "TextSegment", "VisionModel", "assemble_prompt", "count_positions",
    "decode_image", "flatten_for_batch", "load_vision_model",
]
