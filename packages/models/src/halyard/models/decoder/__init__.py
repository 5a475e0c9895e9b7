"""The one decoder skeleton (`Decoder`) and what a family tells it (`DecoderConfig`, `BlockLayout`)."""

from halyard.models.decoder.block import DecoderBlock
from halyard.models.decoder.config import DecoderConfig
from halyard.models.decoder.layout import BlockLayout, LayerKind
from halyard.models.decoder.model import Decoder
from halyard.models.decoder.spec import DecoderShape

__all__ = ["BlockLayout", "Decoder", "DecoderBlock", "DecoderConfig", "DecoderShape", "LayerKind"]
