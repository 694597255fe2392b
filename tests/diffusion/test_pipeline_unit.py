import pytest

from diffsynth.diffusion import BasePipeline, PipelineUnit, PipelineUnitRunner


class RecordingPipeline(BasePipeline):
    """Records placement requests instead of checking them against real models."""

    def __init__(self):
        super().__init__()
        self.placements = []

    def load_models_to_device(self, model_names):
        self.placements.append(tuple(model_names))


class Echo(PipelineUnit):
    """Returns, for each output, the sorted arguments it was called with; counts calls."""

    def __init__(self, **declarations):
        super().__init__(**declarations)
        self.calls = []

    def process(self, pipe, **inputs):
        self.calls.append(inputs)
        return {name: sorted(inputs.items()) for name in self.output_params}


def prompt_unit(**extra):
    return Echo(separate_cfg=True, input_params=("height",), input_params_posi={"prompt": "prompt"},
                input_params_nega={"prompt": "negative_prompt"}, output_params=("prompt_emb",), **extra)


def test_declarations_are_reported():
    unit = prompt_unit()
    assert unit.fetch_input_params() == ["height", "prompt", "negative_prompt"]
    assert unit.fetch_output_params() == ["prompt_emb"]
    shared_name_twice = Echo(separate_cfg=True, input_params=("prompt",), input_params_posi={"p": "prompt"},
                             input_params_nega={"p": "prompt"})
    assert shared_name_twice.fetch_input_params() == ["prompt"]
    bare = PipelineUnit()
    assert (bare.fetch_input_params(), bare.fetch_output_params(), bare.onload_model_names) == ([], [], ())


def test_misspelled_alias_is_accepted():
    unit = PipelineUnit(seperate_cfg=True, input_params_posi={"p": "prompt"}, input_params_nega={"p": "neg"})
    assert unit.separate_cfg and unit.seperate_cfg
    assert not PipelineUnit(seperate_cfg=False).separate_cfg
    with pytest.raises(ValueError, match="contradict"):
        PipelineUnit(separate_cfg=True, seperate_cfg=False)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(input_params="latents"), TypeError, r"input_params='latents' is a string"),
    (dict(onload_model_names="dit"), TypeError, r"onload_model_names='dit'"),
    (dict(separate_cfg=True, take_over=True), ValueError, "both separate_cfg and take_over"),
    (dict(input_params_posi={"p": "prompt"}), ValueError, "not separate_cfg"),
    (dict(separate_cfg=True, input_params_posi={"p": "prompt"}, input_params_nega={"q": "neg"}), ValueError,
     r"\['p'\].*\['q'\]"),
    (dict(input_params_posi=["prompt"], separate_cfg=True), TypeError, "must be a dict"),
])
def test_contradictory_declarations_are_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        PipelineUnit(**kwargs)


def test_process_must_be_implemented():
    with pytest.raises(NotImplementedError, match="PipelineUnit must implement process"):
        PipelineUnit().process(None)


def test_plain_unit_reads_and_writes_the_shared_dict():
    unit = Echo(input_params=("a", "missing"), output_params=("b",))
    shared, posi, nega = PipelineUnitRunner()(unit, RecordingPipeline(), {"a": 1}, {"a": 2}, {})
    assert unit.calls == [{"a": 1, "missing": None}]
    assert shared == {"a": 1, "b": [("a", 1), ("missing", None)]} and posi == {"a": 2} and nega == {}


def test_separate_cfg_runs_twice_with_cfg():
    unit = prompt_unit()
    shared, posi, nega = PipelineUnitRunner()(unit, RecordingPipeline(), {"height": 8, "cfg_scale": 4.0},
                                              {"prompt": "cat"}, {"negative_prompt": "blur"})
    assert unit.calls == [{"height": 8, "prompt": "cat"}, {"height": 8, "prompt": "blur"}]
    assert posi["prompt_emb"] == [("height", 8), ("prompt", "cat")]
    assert nega["prompt_emb"] == [("height", 8), ("prompt", "blur")]
    assert set(shared) == {"height", "cfg_scale"}


@pytest.mark.parametrize("shared", [{"height": 8, "cfg_scale": 1.0}, {"height": 8}])
def test_separate_cfg_runs_once_without_cfg_and_mirrors_its_outputs(shared):
    unit = prompt_unit()
    _, posi, nega = PipelineUnitRunner()(unit, RecordingPipeline(), shared, {"prompt": "cat"},
                                         {"negative_prompt": "blur"})
    assert unit.calls == [{"height": 8, "prompt": "cat"}]
    # Every declared write happens, which the split relies on.
    assert nega["prompt_emb"] == posi["prompt_emb"] == [("height", 8), ("prompt", "cat")]


def test_take_over_unit_gets_and_returns_all_three_dicts():
    class Swap(PipelineUnit):
        def process(self, pipe, inputs_shared, inputs_posi, inputs_nega):
            return {"s": inputs_posi["p"]}, {"p": inputs_nega["n"]}, {"n": inputs_shared["s"]}

    result = PipelineUnitRunner()(Swap(take_over=True), RecordingPipeline(), {"s": 1}, {"p": 2}, {"n": 3})
    assert result == ({"s": 2}, {"p": 3}, {"n": 1})


def test_take_over_unit_must_return_three_dicts():
    class Broken(PipelineUnit):
        def process(self, pipe, inputs_shared, inputs_posi, inputs_nega):
            return inputs_shared

    with pytest.raises(ValueError, match="must return \\(inputs_shared, inputs_posi, inputs_nega\\); it returned dict"):
        PipelineUnitRunner()(Broken(take_over=True), RecordingPipeline(), {}, {}, {})


def test_undeclared_outputs_are_rejected():
    class Liar(PipelineUnit):
        def process(self, pipe):
            return {"declared": 1, "sneaky": 2}

    with pytest.raises(ValueError, match=r"undeclared keys \['sneaky'\]"):
        PipelineUnitRunner()(Liar(output_params=("declared",)), RecordingPipeline(), {}, {}, {})

    class NotADict(PipelineUnit):
        def process(self, pipe):
            return 1

    with pytest.raises(ValueError, match="returned int"):
        PipelineUnitRunner()(NotADict(), RecordingPipeline(), {}, {}, {})


def test_omitted_outputs_keep_their_previous_value():
    class Optional(PipelineUnit):
        def process(self, pipe, edit_image):
            return {} if edit_image is None else {"edit_latents": edit_image}

    shared, _, _ = PipelineUnitRunner()(Optional(input_params=("edit_image",), output_params=("edit_latents",)),
                                        RecordingPipeline(), {"edit_image": None}, {}, {})
    assert shared == {"edit_image": None}


def test_runner_onloads_only_for_units_with_models():
    pipe = RecordingPipeline()
    runner = PipelineUnitRunner()
    runner(Echo(output_params=("a",)), pipe, {}, {}, {})
    runner(Echo(output_params=("b",), onload_model_names=("vae",)), pipe, {}, {}, {})
    runner(prompt_unit(onload_model_names=("text_encoder",)), pipe, {"cfg_scale": 2}, {}, {})
    assert pipe.placements == [("vae",), ("text_encoder",)]
