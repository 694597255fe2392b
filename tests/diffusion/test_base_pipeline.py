import pytest
import torch

from diffsynth.diffusion import BasePipeline, PipelineUnit


class RecordingLinear(torch.nn.Linear):
    """A real Linear that also logs every ``to()`` it receives."""

    def __init__(self):
        super().__init__(2, 2)
        self.moves = []

    def to(self, *args, **kwargs):
        self.moves.append(torch.device(*args, **kwargs))
        return super().to(*args, **kwargs)


class ThreeModels(BasePipeline):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dit, self.vae, self.text_encoder = RecordingLinear(), RecordingLinear(), RecordingLinear()
        self.tokenizer = object()
        self.image_encoder = None


def devices(pipe):
    return {name: next(model.parameters()).device.type for name, model in pipe.named_children()}


def test_onloads_the_named_models_only():
    # "meta" stands in for an accelerator: moving there is real, and visibly different from the CPU.
    pipe = ThreeModels(device="meta")
    pipe.load_models_to_device(["dit"])
    assert devices(pipe) == {"dit": "meta", "vae": "cpu", "text_encoder": "cpu"}
    pipe.load_models_to_device(["dit", "vae"])
    assert devices(pipe) == {"dit": "meta", "vae": "meta", "text_encoder": "cpu"}
    # Models already in place are not moved again.
    assert [len(m.moves) for m in (pipe.dit, pipe.vae, pipe.text_encoder)] == [1, 1, 0]


def test_offloads_every_other_model():
    pipe = ThreeModels(device="cpu", offload_device="meta")
    pipe.load_models_to_device(("vae",))
    assert devices(pipe) == {"dit": "meta", "vae": "cpu", "text_encoder": "meta"}
    assert pipe.dit.moves == [torch.device("meta")] and pipe.vae.moves == []


def test_does_nothing_when_placement_is_managed_elsewhere():
    pipe = ThreeModels(device="meta", manage_model_devices=False)
    pipe.load_models_to_device(["dit", "not_even_a_model"])
    assert devices(pipe) == {"dit": "cpu", "vae": "cpu", "text_encoder": "cpu"}


def test_slots_without_a_model_are_skipped_and_typos_are_named():
    pipe = ThreeModels(device="meta")
    pipe.load_models_to_device(["tokenizer", "image_encoder"])
    assert devices(pipe) == {"dit": "cpu", "vae": "cpu", "text_encoder": "cpu"}
    with pytest.raises(ValueError, match=r"unknown model names \['dti'\].*\['dit', 'vae', 'text_encoder'\]"):
        pipe.load_models_to_device(["dti"])
    with pytest.raises(TypeError, match="model_names='dit'"):
        pipe.load_models_to_device("dit")


def test_runner_onloads_a_unit_models():
    class Encode(PipelineUnit):
        def process(self, pipe, x):
            return {"y": pipe.vae.weight.device.type}

    pipe = ThreeModels(device="meta")
    shared, _, _ = pipe.run_units({"x": 1}, {}, {}, units=[Encode(input_params=("x",), output_params=("y",),
                                                                  onload_model_names=("vae",))])
    assert shared["y"] == "meta" and devices(pipe)["dit"] == "cpu"


def test_bad_constructor_arguments_are_named():
    with pytest.raises(ValueError, match="device='gpu'"):
        BasePipeline(device="gpu")
    with pytest.raises(TypeError, match="torch_dtype='bf16'"):
        BasePipeline(torch_dtype="bf16")
    pipe = BasePipeline(device="cpu", torch_dtype=torch.bfloat16)
    assert pipe.device == torch.device("cpu") and pipe.torch_dtype == torch.bfloat16 and pipe.units == []


class ToyScheduler:
    def __init__(self, timesteps):
        self.timesteps = timesteps
        self.outputs = []

    def step(self, model_output, timestep, sample):
        self.outputs.append(model_output)
        return sample - 0.1 * model_output


class LatentsUnit(PipelineUnit):
    def __init__(self):
        super().__init__(input_params=("noise",), output_params=("latents",))

    def process(self, pipe, noise):
        return {"latents": noise.clone()}


class PromptUnit(PipelineUnit):
    def __init__(self):
        super().__init__(separate_cfg=True, input_params_posi={"prompt": "prompt"},
                         input_params_nega={"prompt": "negative_prompt"}, output_params=("context",),
                         onload_model_names=("text_encoder",))

    def process(self, pipe, prompt):
        return {"context": torch.tensor(float(len(prompt)))}


class ToyPipeline(BasePipeline):
    """The smallest concrete pipeline: a "denoiser" that predicts its context, the prompt's length."""

    def __init__(self):
        super().__init__(device="cpu")
        self.dit, self.text_encoder = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
        self.units = [LatentsUnit(), PromptUnit()]
        self.scheduler = ToyScheduler([3.0, 2.0, 1.0])
        self.calls = []

    def model_fn(self, latents, context, timestep, **others):
        self.calls.append((float(context), timestep, sorted(others)))
        return context * torch.ones_like(latents)

    def decode(self, inputs_shared, inputs_posi, inputs_nega):
        return inputs_shared["latents"]


@pytest.mark.parametrize("cfg_scale, predictions", [(4.0, 1 + 4 * (3 - 1)), (1.0, 3.0)])
def test_denoise_combines_branches_with_cfg(cfg_scale, predictions):
    pipe = ToyPipeline()
    noise = torch.zeros(2)
    result = pipe.denoise({"noise": noise, "cfg_scale": cfg_scale}, {"prompt": "cat"}, {"negative_prompt": "x"})
    assert all(torch.equal(out, torch.full((2,), predictions)) for out in pipe.scheduler.outputs)
    assert len(pipe.scheduler.outputs) == 3
    torch.testing.assert_close(result, torch.full((2,), -0.1 * predictions * 3))
    contexts = [context for context, _, _ in pipe.calls]
    assert contexts == ([3.0, 1.0] * 3 if cfg_scale != 1 else [3.0] * 3)
    assert [timestep for _, timestep, _ in pipe.calls][:2] == ([3.0, 3.0] if cfg_scale != 1 else [3.0, 2.0])
    # model_fn sees the shared state merged with one branch.
    assert pipe.calls[0][2] == ["cfg_scale", "noise", "prompt"]
    if cfg_scale != 1:
        assert pipe.calls[1][2] == ["cfg_scale", "negative_prompt", "noise"]


def test_denoise_explains_missing_pieces():
    pipe = ToyPipeline()
    pipe.scheduler = None
    with pytest.raises(ValueError, match="scheduler is None"):
        pipe.denoise({"noise": torch.zeros(1)}, {"prompt": "a"}, {})
    pipe = ToyPipeline()
    pipe.units = []
    with pytest.raises(ValueError, match="no 'latents' in inputs_shared"):
        pipe.denoise({}, {}, {})
    with pytest.raises(NotImplementedError, match="BasePipeline must implement decode"):
        BasePipeline().decode({}, {}, {})


def test_a_key_in_two_dicts_is_ambiguous_for_model_fn():
    pipe = ToyPipeline()
    with pytest.raises(ValueError, match=r"keys \['context'\]"):
        pipe.predict_noise({"latents": torch.zeros(1), "context": 1}, {"context": 2}, {}, timestep=1.0)
    with pytest.raises(ValueError, match=r"keys \['timestep'\]"):
        pipe.predict_noise({"latents": torch.zeros(1), "timestep": 0}, {"context": 2}, {}, timestep=1.0)


def test_split_method_uses_the_pipeline_units():
    pipe = ToyPipeline()
    assert pipe.split_pipeline_units(["text_encoder"]) == ([pipe.units[1]], [pipe.units[0]])
    assert pipe.split_pipeline_units(["dit"]) == ([], pipe.units)
