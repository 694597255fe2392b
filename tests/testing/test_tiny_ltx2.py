"""The tiny LTX-2 repo: the released diffusers layout, registered with the builders, deterministic for a seed."""

import hashlib
import json

from diffsynth.pipelines.ltx2.units import SCHEDULER_CONFIG
from diffsynth.testing.tiny_ltx2 import LTX2_BUILDERS, LTX2_MODEL_ID, LTX2_PATTERNS, build_tiny_ltx2
from diffsynth.testing.tiny_models import BUILDERS


def test_the_builder_is_registered():
    assert all(BUILDERS[name] is builder for name, builder in LTX2_BUILDERS.items())


def test_repo_has_the_released_layout(tiny_root):
    repo = tiny_root / LTX2_MODEL_ID
    for folder in ("transformer", "text_encoder"):
        shards = sorted(repo.glob(LTX2_PATTERNS["dit" if folder == "transformer" else folder]))
        assert len(shards) >= 2, folder
        index = next((repo / folder).glob("*.safetensors.index.json"))
        assert sorted(set(json.loads(index.read_text())["weight_map"].values())) == [p.name for p in shards]
    for slot in ("connectors", "vae", "audio_vae", "vocoder"):
        assert len(list(repo.glob(LTX2_PATTERNS[slot]))) == 1, slot
    assert json.loads((repo / "scheduler" / "scheduler_config.json").read_text()) == SCHEDULER_CONFIG
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == "LTX2Pipeline"
    assert index["connectors"] == ["ltx2", "LTX2TextConnectors"] and index["vocoder"] == ["ltx2", "LTX2Vocoder"]
    text_encoder = json.loads((repo / "text_encoder" / "config.json").read_text())
    assert text_encoder["architectures"] == ["Gemma3ForConditionalGeneration"]
    tokenizer = json.loads((repo / "tokenizer" / "tokenizer_config.json").read_text())
    assert tokenizer["tokenizer_class"] == "GemmaTokenizer"


def digest(repo):
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(repo.rglob("*.safetensors"))}


def test_same_seed_same_weights_other_seed_other_weights(tmp_path, tiny_root):
    again = build_tiny_ltx2(tmp_path / "again", seed=0)
    other = build_tiny_ltx2(tmp_path / "other", seed=1)
    assert digest(again) == digest(tiny_root / LTX2_MODEL_ID)
    assert all(digest(other)[name] != value for name, value in digest(again).items() if "vocoder" in name)
