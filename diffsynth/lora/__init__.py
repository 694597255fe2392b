"""LoRA files: the layouts each tool reads (``formats`` writes them, ``reading`` reads them, ``adapters`` adds
LyCORIS's LoHa and LoKr and DoRA's ``dora_scale``; no other module spells a key), merging, converting and
inspecting.

Command line: ``python -m diffsynth.lora inspect FILE`` reports what a file is and how much of it diffusers, ComfyUI,
DiffSynth-Studio and musubi-tuner load at which strength; ``python -m diffsynth.lora convert IN OUT --to LAYOUT``
rewrites a file in another layout.
"""

from .adapters import LoHaLayer, LoKrLayer
from .formats import LAYOUTS, LoRALayer, LoRAWeights, from_peft_state_dict, to_state_dict
from .inspect import Inspection, inspect_lora
from .merge import check_lora, load_lora
from .naming import ModuleNaming, lora_layer_names, naming_for
from .reading import read_file, read_lora

__all__ = [
    "LAYOUTS", "Inspection", "LoHaLayer", "LoKrLayer", "LoRALayer", "LoRAWeights", "ModuleNaming", "check_lora",
    "from_peft_state_dict", "inspect_lora", "load_lora", "lora_layer_names", "naming_for", "read_file", "read_lora",
    "to_state_dict",
]
