"""Manual check, not part of the tests: the Wan Fun Control and Control-Camera models here against the reference's own
code (DiffSynth-Studio, a bare git mirror such as ``fetch github:modelscope/DiffSynth-Studio`` makes).

diffusers has no pipeline for these models, so the reference is the only definition of their forward. This script
writes the reference's DiT files (``models/wan_video_dit.py``, its camera controller, the modules they import) into a
scratch package named ``reference_diffsynth``, and takes from ``pipelines/wan_video.py`` the two functions that hold
the Fun logic: ``model_fn_wan_video`` (the reference-image tokens, the camera adapter) and
``WanVideoUnit_FunCameraControl.process`` (the camera motion's Plücker embedding, its folding, the Wan2.1 camera
model's image condition). Their annotations are dropped so that they compile without the rest of the reference.

For each Fun structure (1.0 Control, V1.1 Control with ``ref_conv``, V1.1 Control-Camera, Wan2.2 Control,
Wan2.2 Control-Camera) it builds a tiny ``WanFunTransformer3DModel`` / ``WanTransformer3DModel`` with random weights,
loads the same weights into the reference's ``WanModel`` under the original names (``dit_original_keys``), and
prints the largest difference between the two forwards on the same inputs, next to how much the control input moves
the output. For the camera it also compares the camera latents and ``y`` that ``FunCameraUnit`` makes with the
reference unit's, on a stand-in pipeline whose VAE returns fixed latents.

Usage::

    python scripts/check_wan_fun_reference.py [--mirror /work/.mirror/modelscope+DiffSynth-Studio/repo] [--rev HEAD]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

from diffsynth.pipelines.wan_video.camera import camera_latents, camera_poses, plucker_embedding
from diffsynth.pipelines.wan_video.fun_control import FunCameraUnit
from diffsynth.pipelines.wan_video.original import dit_original_keys
from diffsynth.testing.tiny_wan_fun import FUN_RELEASES, FunRelease, tiny_fun_transformer

PACKAGE = "reference_diffsynth"
FILES = ("diffsynth/models/wan_video_dit.py", "diffsynth/models/wan_video_camera_controller.py",
         "diffsynth/models/wantodance.py", "diffsynth/core/gradient/gradient_checkpoint.py")
CLIP_DIM = 1280  # the reference's img_emb reads 1280-wide CLIP features whatever the model's size
HEAD_DIM = 12


def git(mirror: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True, capture_output=True).stdout


def export(mirror: Path, rev: str, folder: Path) -> tuple[str, str]:
    """Writes the reference's DiT modules as ``reference_diffsynth`` into ``folder``; returns the commit and the
    source of ``pipelines/wan_video.py``."""
    commit = git(mirror, "rev-parse", rev).decode().strip()
    for path in FILES:
        target = folder / PACKAGE / path.removeprefix("diffsynth/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(git(mirror, "show", f"{commit}:{path}"))
    for package in ("", "models", "core"):
        (folder / PACKAGE / package / "__init__.py").touch()
    (folder / PACKAGE / "core" / "gradient" / "__init__.py").write_text(
        "from .gradient_checkpoint import gradient_checkpoint_forward\n")
    return commit, git(mirror, "show", f"{commit}:diffsynth/pipelines/wan_video.py").decode()


def reference_function(source: str, name: str, namespace: dict, owner: str | None = None):
    """The function ``name`` (a method of class ``owner``) of ``source``, compiled without its annotations."""
    tree = ast.parse(source)
    scope = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == owner).body \
        if owner else tree.body
    function = next(node for node in scope if isinstance(node, ast.FunctionDef) and node.name == name)
    for argument in (*function.args.args, *function.args.kwonlyargs):
        argument.annotation = None
    function.returns = None
    exec(compile(ast.unparse(function), f"<reference {name}>", "exec"), namespace)  # noqa: S102 - the reference's code
    return namespace[name]


def reference_model(dit: torch.nn.Module, release: FunRelease, dit_module) -> torch.nn.Module:
    config = dit.config
    model = dit_module.WanModel(
        dim=config.num_attention_heads * config.attention_head_dim, in_dim=config.in_channels, ffn_dim=config.ffn_dim,
        out_dim=config.out_channels, text_dim=config.text_dim, freq_dim=config.freq_dim, eps=config.eps,
        patch_size=tuple(config.patch_size), num_heads=config.num_attention_heads, num_layers=config.num_layers,
        has_image_input=release.clip, has_ref_conv=release.reference_conv, add_control_adapter=release.camera,
        require_clip_embedding=release.clip,
    ).eval()  # fmt: skip
    state = dit.state_dict()
    names = dit_original_keys(list(state))
    model.load_state_dict({names[key]: value for key, value in state.items()}, strict=True)
    return model


def ours_and_reference(release: FunRelease, dit_module, model_fn) -> None:
    torch.manual_seed(0)
    dit = tiny_fun_transformer(release, 0)
    # Rebuilt with heads of 12 channels (the reference splits a head's RoPE into thirds of even width, 4 + 4 + 4
    # here, as diffusers does; 16 would not split so) and, with CLIP, the reference's CLIP width.
    config = {**dit.config, "attention_head_dim": HEAD_DIM}
    if release.clip:
        config.update(image_dim=CLIP_DIM, added_kv_proj_dim=HEAD_DIM * config["num_attention_heads"])
    dit = type(dit).from_config({k: v for k, v in config.items() if not k.startswith("_")}).eval()
    reference = reference_model(dit, release, dit_module)
    latents = torch.randn(1, 16, 3, 4, 6)
    y = torch.randn(1, release.in_channels - 16, 3, 4, 6)
    # 512 prompt tokens, as the pipelines pad them: diffusers' image cross-attention counts the image tokens back
    # from 512 text tokens.
    context, timestep = torch.randn(1, 512, dit.config.text_dim), torch.tensor([640.0])
    # The reference's cross-attention takes the first 257 context tokens as the image's (a ViT-H/14's count).
    clip = torch.randn(1, 257, CLIP_DIM) if release.clip else None
    extra_ours, extra_reference = {}, {}
    if release.reference_conv:
        reference_latents = torch.randn(1, 16, 1, 4, 6)
        extra_ours["reference_latents"] = extra_reference["reference_latents"] = reference_latents
    if release.camera:
        camera = camera_latents(plucker_embedding(camera_poses("LeftUp", 9, 0.1), 32, 48))
        extra_ours["camera_latents"], extra_reference["control_camera_latents_input"] = camera, camera
    with torch.no_grad():
        theirs = model_fn(dit=reference, latents=latents, timestep=timestep, context=context, clip_feature=clip, y=y,
                          **extra_reference)
        ours = dit(hidden_states=torch.cat([latents, y], dim=1), timestep=timestep, encoder_hidden_states=context,
                   encoder_hidden_states_image=clip, return_dict=False, **extra_ours)[0]
        other_y = dit(hidden_states=torch.cat([latents, torch.randn_like(y)], dim=1), timestep=timestep,
                      encoder_hidden_states=context, encoder_hidden_states_image=clip, return_dict=False,
                      **extra_ours)[0]
    print(f"  forward: max |ours - reference| = {float((ours - theirs).abs().max()):.2e}; another control input "
          f"moves ours by {float((other_y - ours).abs().max()):.2e}")


def camera_inputs(unit_process) -> None:
    """Our camera unit against the reference's, on a stand-in pipeline whose VAE returns fixed latents."""
    torch.manual_seed(1)
    height, width, frames = 32, 48, 9
    image_latents = torch.randn(1, 16, 1, height // 8, width // 8)
    latents = torch.zeros(1, 16, 3, height // 8, width // 8)
    adapter = types.SimpleNamespace(process_camera_coordinates=None)
    camera_module = importlib.import_module(f"{PACKAGE}.models.wan_video_camera_controller")
    adapter.process_camera_coordinates = types.MethodType(camera_module.SimpleAdapter.process_camera_coordinates,
                                                          adapter)
    from PIL import Image

    image = Image.new("RGB", (width, height), (10, 200, 30))
    stand_in = types.SimpleNamespace(
        device="cpu", torch_dtype=torch.float32, load_models_to_device=lambda names: None,
        dit=types.SimpleNamespace(control_adapter=adapter, in_dim=32),
        preprocess_video=lambda video: video, preprocess_image=lambda image: image,
        vae=types.SimpleNamespace(encode=lambda *args, **kwargs: image_latents),
    )  # fmt: skip
    unit = types.SimpleNamespace(onload_model_names=("vae",))
    theirs = unit_process(unit, stand_in, height, width, frames, "LeftUp", 0.1, None, latents, image, False, None,
                          None)
    # Ours on a stand-in of the same kind: its VAE gives the same first-frame latents (statistics 0 and 1).
    from diffusers.configuration_utils import FrozenDict

    ours_pipe = types.SimpleNamespace(
        device="cpu", torch_dtype=torch.float32, latent_channels=16,
        dit=types.SimpleNamespace(config=FrozenDict(in_channels=32, out_channels=16, camera_channels=24)),
        latent_shape=lambda h, w, n: (1, 16, (n - 1) // 4 + 1, h // 8, w // 8),
        latent_statistics=lambda like: (0.0, 1.0),
        vae=types.SimpleNamespace(dtype=torch.float32, encode=lambda pixels: types.SimpleNamespace(
            latent_dist=types.SimpleNamespace(mode=lambda: image_latents))),
    )  # fmt: skip
    ours = FunCameraUnit().process(ours_pipe, "LeftUp", 0.1, None, image, height, width, frames,
                                   y=torch.zeros(1, 20, 3, height // 8, width // 8))
    print(f"  camera latents: max |ours - reference| = "
          f"{float((ours['camera_latents'] - theirs['control_camera_latents_input']).abs().max()):.2e}")
    print(f"  Wan2.1 camera y: max |ours - reference| = {float((ours['y'] - theirs['y']).abs().max()):.2e}")


def control_inputs(unit_process, image_channels: int, image_dim: int | None) -> None:
    """Our control unit against the reference's ``WanVideoUnit_FunControl``, with and without a first-frame ``y``."""
    from diffusers.configuration_utils import FrozenDict
    from PIL import Image

    from diffsynth.pipelines.wan_video.fun_control import FunControlUnit

    torch.manual_seed(2)
    height, width, frames = 32, 48, 9
    control_latents = torch.randn(1, 16, 3, height // 8, width // 8)
    encode = types.SimpleNamespace(latent_dist=types.SimpleNamespace(mode=lambda: control_latents))
    in_channels = 32 + image_channels
    theirs_pipe = types.SimpleNamespace(
        device="cpu", torch_dtype=torch.float32, load_models_to_device=lambda names: None,
        dit=types.SimpleNamespace(in_dim=in_channels), preprocess_video=lambda video: video,
        vae=types.SimpleNamespace(encode=lambda *args, **kwargs: control_latents))
    ours_pipe = types.SimpleNamespace(
        device="cpu", torch_dtype=torch.float32, latent_statistics=lambda like: (0.0, 1.0),
        dit=types.SimpleNamespace(config=FrozenDict(in_channels=in_channels, out_channels=16, image_dim=image_dim)),
        takes_image_embedding=lambda: image_dim is not None,
        vae=types.SimpleNamespace(dtype=torch.float32, encode=lambda pixels: encode))  # fmt: skip
    video = [Image.new("RGB", (width, height))] * frames
    unit = types.SimpleNamespace(onload_model_names=("vae",))
    for given in (None, torch.randn(1, 4 + 16, 3, height // 8, width // 8)):
        # With a first frame, a model with CLIP also has its features; the reference zeroes y whenever the CLIP
        # features are missing, so for Wan2.2 (no CLIP encoder) it drops a given first frame, which ours keeps.
        features = torch.randn(1, 257, image_dim) if image_dim and given is not None else None
        theirs = unit_process(unit, theirs_pipe, video, frames, height, width, False, None, None, features, given,
                              torch.zeros_like(control_latents))
        ours = FunControlUnit().process(ours_pipe, video, height, width, frames, y=given, clip_feature=features)
        clip = "" if image_dim is None or given is not None else \
            f", zero CLIP features {tuple(ours['clip_feature'].shape)} vs {tuple(theirs['clip_feature'].shape)}"
        note = " (the reference drops the first frame here; ours keeps it)" if given is not None and not image_dim \
            else ""
        print(f"  y {'with' if given is not None else 'without'} a first frame: max |ours - reference| = "
              f"{float((ours['y'] - theirs['y']).abs().max()):.2e}{clip}{note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=Path("/work/.mirror/modelscope+DiffSynth-Studio/repo"))
    parser.add_argument("--rev", default="HEAD")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        commit, pipeline_source = export(args.mirror, args.rev, Path(scratch))
        sys.path.insert(0, scratch)
        dit_module = importlib.import_module(f"{PACKAGE}.models.wan_video_dit")
        from einops import rearrange

        class Absent:  # the model classes model_fn_wan_video tests against before the plain Wan path
            pass

        namespace = {"torch": torch, "rearrange": rearrange, "sinusoidal_embedding_1d":
                     dit_module.sinusoidal_embedding_1d, "gradient_checkpoint_forward":
                     dit_module.gradient_checkpoint_forward, "LongCatVideoTransformer3DModel": Absent,
                     "WanAnimate2Transformer": Absent}  # fmt: skip
        model_fn = reference_function(pipeline_source, "model_fn_wan_video", namespace)
        unit_process = reference_function(pipeline_source, "process", dict(namespace),
                                          owner="WanVideoUnit_FunCameraControl")
        print(f"DiffSynth-Studio {commit}")
        for model_id, release in FUN_RELEASES.items():
            print(model_id)
            ours_and_reference(release, dit_module, model_fn)
        print("camera inputs")
        camera_inputs(unit_process)
        control_process = reference_function(pipeline_source, "process", dict(namespace),
                                             owner="WanVideoUnit_FunControl")
        for label, channels, image_dim in (("Wan2.1", 16, CLIP_DIM), ("Wan2.2", 20, None)):
            print(f"control inputs, {label}")
            control_inputs(control_process, channels, image_dim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
