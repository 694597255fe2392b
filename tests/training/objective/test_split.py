"""The unit-graph split, checked by running unit graphs on symbolic values.

Every output is a fresh string that names the unit and everything it read, so two runs read the same values exactly
when every unit saw the same history. A split is exact when stage 1 (the unrelated units from the initial state, then
cache pruning) followed by stage 2 (the related units from the cache) gives each unit the values it read in the full
run, and leaves the final keys as the full run does.
"""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffsynth.diffusion import (
    SCOPES,
    BasePipeline,
    PipelineUnit,
    PruneCacheUnit,
    required_cache_keys,
    split_pipeline_units,
    stage_one_units,
    unit_access,
)
from diffsynth.diffusion.unit_graph import expand_keys

NAMES = ("a", "b", "c", "d")
MODELS = ("dit", "vae", "text_encoder")


class SymbolicUnit(PipelineUnit):
    """Records what each call reads; every output is a symbol of the unit's name and those values."""

    def __init__(self, name, **declarations):
        super().__init__(**declarations)
        self.name = name
        self.calls = []

    def process(self, pipe, **inputs):
        self.calls.append(dict(inputs))
        seen = ",".join(f"{arg}={inputs[arg]}" for arg in sorted(inputs))
        return {out: f"{self.name}.{out}({seen})" for out in self.output_params}


class SymbolicTakeOver(PipelineUnit):
    """A take_over unit that touches only some scopes; the split must still be safe with its declarations."""

    def __init__(self, name, read_scopes, write_scopes, **declarations):
        super().__init__(take_over=True, **declarations)
        self.name, self.read_scopes, self.write_scopes = name, read_scopes, write_scopes
        self.calls = []

    def process(self, pipe, inputs_shared, inputs_posi, inputs_nega):
        states = dict(zip(SCOPES, (inputs_shared, inputs_posi, inputs_nega)))
        seen = {f"{scope}.{key}": states[scope].get(key) for scope in self.read_scopes for key in self.input_params}
        self.calls.append(seen)
        for scope in self.write_scopes:
            for out in self.output_params:
                states[scope][out] = f"{self.name}.{scope}.{out}({sorted(seen.items())})"
        return inputs_shared, inputs_posi, inputs_nega


def plain(name, reads=(), writes=(), models=()):
    return SymbolicUnit(name, input_params=reads, output_params=writes, onload_model_names=models)


def initial_state(cfg_scale=1.0):
    shared = {name: f"shared.{name}@0" for name in NAMES} | {"cfg_scale": cfg_scale}
    return shared, {name: f"posi.{name}@0" for name in NAMES}, {name: f"nega.{name}@0" for name in NAMES}


PIPE = BasePipeline(manage_model_devices=False)


def simulate(units, state):
    """Runs ``units`` from a copy of ``state``; returns each symbolic unit's calls and the final state."""
    for unit in units:
        if hasattr(unit, "calls"):
            unit.calls.clear()
    final = PIPE.run_units(*(dict(part) for part in state), units=units)
    return {unit.name: list(unit.calls) for unit in units if hasattr(unit, "calls")}, final


def mismatches(units, related, unrelated, state, final_keys=(), prune_keep=None):
    """Every way the two-stage run differs from the full run (empty: the split is exact)."""
    full_calls, full_state = simulate(units, state)
    stage_one = list(unrelated) if prune_keep is None else [*unrelated, PruneCacheUnit(prune_keep)]
    first_calls, cache = simulate(stage_one, state)
    second_calls, final_state = simulate(related, cache)
    problems = [name for name, calls in {**first_calls, **second_calls}.items() if calls != full_calls[name]]
    for scope, key in sorted(expand_keys(final_keys)):
        index = SCOPES.index(scope)
        if final_state[index].get(key) != full_state[index].get(key):
            problems.append(f"final {scope}.{key}")
    return problems


def assert_exact(units, model_names, state, final_keys=()):
    """Splits with the public API, checks the stages partition the units, runs both stages with pruning."""
    related, unrelated = split_pipeline_units(units, model_names, final_keys=final_keys)
    assert [u for u in units if u in related or u in unrelated] == list(units)
    assert not set(map(id, related)) & set(map(id, unrelated))
    stage_one = stage_one_units(units, model_names, extra_keys=final_keys)
    assert stage_one[:-1] == unrelated and isinstance(stage_one[-1], PruneCacheUnit)
    assert mismatches(units, related, unrelated, state, final_keys, stage_one[-1].keep) == []
    return related, unrelated


def accesses_with_final(units, final_keys=()):
    reads = [unit_access(unit).reads for unit in units] + [expand_keys(final_keys)]
    writes = [unit_access(unit).writes for unit in units] + [frozenset()]
    return reads, writes


def producer(writes, key, before):
    earlier = [index for index in range(before) if key in writes[index]]
    return earlier[-1] if earlier else None


def closed(reads, writes, related):
    """C1, the generalised update-chain rule and the shadowed-producer rule, checked directly."""
    for index, keys in enumerate(reads):
        for key in keys:
            source = producer(writes, key, index)
            later = [w for w in range(index + 1, len(writes)) if key in writes[w]]
            if index not in related:
                if source is not None and source in related:
                    return False
                continue
            if any(w not in related for w in later):
                return False
            if source not in related and any(key in writes[w] and w in related for w in range(index)):
                return False
    return True


def seed_split(units, model_names):
    """The published fixed point (forward closure, update chains of the first related reader) on the same keys."""
    reads, writes = accesses_with_final(units)
    reads, writes = reads[:-1], writes[:-1]
    related = {i for i, unit in enumerate(units) if set(model_names) & set(unit.onload_model_names)}
    while True:
        grown = set(related)
        grown |= {i for i in range(len(units)) for key in reads[i] if producer(writes, key, i) in related}
        for key in {key for i in related for key in reads[i]}:
            first = min(i for i in related if key in reads[i])
            chain = [i for i in range(len(units)) if key in writes[i]]
            if first in chain:
                grown |= set(chain[chain.index(first) + 1:])
        if grown == related:
            return [units[i] for i in sorted(related)], [u for i, u in enumerate(units) if i not in related]
        related = grown


@st.composite
def unit_graphs(draw, kinds=("plain", "plain", "plain", "separate_cfg", "take_over"), max_units=8):
    units = []
    for index in range(draw(st.integers(1, max_units))):
        kind = draw(st.sampled_from(kinds))
        reads = tuple(draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True)))
        writes = tuple(draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True)))
        models = tuple(draw(st.lists(st.sampled_from(MODELS), max_size=2, unique=True)))
        name = f"u{index}"
        if kind == "plain":
            units.append(plain(name, reads, writes, models))
        elif kind == "separate_cfg":
            branch = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True))
            nega = {f"p_{key}": draw(st.sampled_from(NAMES)) for key in branch}
            units.append(SymbolicUnit(name, separate_cfg=True, input_params=reads, output_params=writes,
                                      input_params_posi={f"p_{key}": key for key in branch}, input_params_nega=nega,
                                      onload_model_names=models))
        else:
            scopes = st.lists(st.sampled_from(SCOPES), min_size=1, unique=True)
            units.append(SymbolicTakeOver(name, draw(scopes), draw(scopes), input_params=reads,
                                          output_params=writes, onload_model_names=models))
    model_names = draw(st.lists(st.sampled_from(MODELS), max_size=2, unique=True))
    final_keys = tuple(draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True)))
    return units, model_names, final_keys, draw(st.sampled_from([1.0, 4.0]))


@settings(max_examples=300, deadline=None)
@given(unit_graphs())
def test_random_graphs_split_exactly(graph):
    units, model_names, final_keys, cfg_scale = graph
    related, unrelated = assert_exact(units, model_names, initial_state(cfg_scale), final_keys)
    reads, writes = accesses_with_final(units, final_keys)
    indices = {i for i, unit in enumerate(units) if unit in related} | {len(units)}
    assert closed(reads, writes, indices)
    for i in range(len(units)):  # C1: no stage-1 unit reads a value a stage-2 unit produced
        if i not in indices:
            assert all(producer(writes, key, i) not in indices for key in reads[i])
    for key in {key for r in reads for key in r}:  # C2, the seed's update-chain condition
        readers = [i for i in sorted(indices) if key in reads[i]]
        chain = [i for i in range(len(units)) if key in writes[i]]
        if readers and readers[0] in chain:
            assert set(chain[chain.index(readers[0]) + 1:]) <= indices


@settings(max_examples=150, deadline=None)
@given(unit_graphs(kinds=("plain", "separate_cfg", "take_over"), max_units=6))
def test_related_set_is_the_least_closed_set(graph):
    units, model_names, final_keys, _ = graph
    related, _ = split_pipeline_units(units, model_names, final_keys=final_keys)
    reads, writes = accesses_with_final(units, final_keys)
    start = {i for i, unit in enumerate(units) if set(model_names) & set(unit.onload_model_names)}
    ours = {i for i, unit in enumerate(units) if unit in related}
    assert start <= ours
    for extra in itertools.chain.from_iterable(itertools.combinations(range(len(units)), r)
                                               for r in range(len(units) + 1)):
        candidate = start | set(extra) | {len(units)}
        if closed(reads, writes, candidate):
            assert ours <= candidate


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
def test_later_model_free_update_of_a_related_input_is_related(cfg_scale):
    # The seed's gap: u1 reads p, then model-free u2 updates p. Stage 1 would run u2 and cache its p.
    units = [plain("u0", writes=("a",)), plain("u1", ("a",), ("b",), ("dit",)), plain("u2", ("a",), ("a",))]
    related, unrelated = assert_exact(units, ["dit"], initial_state(cfg_scale))
    assert [u.name for u in related] == ["u1", "u2"] and [u.name for u in unrelated] == ["u0"]
    seed_related, seed_unrelated = seed_split(units, ["dit"])
    assert [u.name for u in seed_related] == ["u1"]
    assert mismatches(units, seed_related, seed_unrelated, initial_state(cfg_scale)) == ["u1"]


def test_shadowed_producer_is_related():
    # u0 (trained) writes a, model-free u1 overwrites it, u2 (trained) reads u1's value: stage 2 would re-run u0.
    units = [plain("u0", writes=("a",), models=("dit",)), plain("u1", ("b",), ("a",)), plain("u2", ("a",), ("c",),
                                                                                             ("dit",))]
    related, _ = assert_exact(units, ["dit"], initial_state())
    assert [u.name for u in related] == ["u0", "u1", "u2"]
    seed_related, seed_unrelated = seed_split(units, ["dit"])
    assert mismatches(units, seed_related, seed_unrelated, initial_state()) == ["u2"]


def test_parameter_updated_twice():
    units = [plain("u0", writes=("a",)), plain("u1", ("a",), ("a",), ("dit",)), plain("u2", ("a",), ("a",)),
             plain("u3", ("a",), ("a",)), plain("u4", ("b",), ("c",))]
    related, unrelated = assert_exact(units, ["dit"], initial_state())
    assert [u.name for u in related] == ["u1", "u2", "u3"] and [u.name for u in unrelated] == ["u0", "u4"]


def test_chain_first_consumed_inside_the_related_set():
    # u2 joins through its read of u1's b; it is the first related reader of a, so the later writer u3 and u3's
    # reader u4 follow, while u0, which produced the a that u2 reads, stays in stage 1.
    units = [plain("u0", writes=("a",)), plain("u1", writes=("b",), models=("dit",)),
             plain("u2", ("a", "b"), ("a",)), plain("u3", ("c",), ("a",)), plain("u4", ("a",), ("d",))]
    related, unrelated = assert_exact(units, ["dit"], initial_state())
    assert [u.name for u in related] == ["u1", "u2", "u3", "u4"] and [u.name for u in unrelated] == ["u0"]


@pytest.mark.parametrize("model_names", [["dit"], [], ["lora_target_that_no_unit_uses"]])
def test_nothing_related_without_a_matching_model(model_names):
    units = [plain("u0", writes=("a",)), plain("u1", ("a",), ("b",), ("vae",)), plain("u2", ("b",), ("a",))]
    related, unrelated = assert_exact(units, model_names, initial_state(), final_keys=("a", "b"))
    assert related == [] and unrelated == units


def test_units_without_models_are_never_related_on_their_own():
    units = [plain("u0", writes=("a",)), plain("u1", ("a",), ("b",)), plain("u2", ("b",), ("c",))]
    assert split_pipeline_units(units, ["dit"]) == ([], units)


def test_final_keys_pull_in_the_last_overwrite():
    units = [plain("u0", writes=("a",), models=("dit",)), plain("u1", ("b",), ("a",))]
    assert [u.name for u in split_pipeline_units(units, ["dit"])[0]] == ["u0"]
    related, _ = assert_exact(units, ["dit"], initial_state(), final_keys=("a",))
    assert [u.name for u in related] == ["u0", "u1"]


def prompt_pipeline():
    return [
        plain("shape", ("a",), ("a",)),
        SymbolicUnit("prompt", separate_cfg=True, input_params_posi={"prompt": "b"},
                     input_params_nega={"prompt": "c"}, output_params=("emb",), onload_model_names=("text_encoder",)),
        SymbolicUnit("context", separate_cfg=True, input_params=("a",), input_params_posi={"emb": "emb"},
                     input_params_nega={"emb": "emb"}, output_params=("ctx",), onload_model_names=("dit",)),
        plain("encode", ("d",), ("latents",), ("vae",)),
        plain("noise", ("a",), ("noise",)),
    ]


@pytest.mark.parametrize("cfg_scale", [1.0, 4.0])
@pytest.mark.parametrize("model_names, expected", [(["dit"], ["context"]),
                                                   (["text_encoder"], ["prompt", "context"])])
def test_separate_cfg_units_split_on_branch_keys(cfg_scale, model_names, expected):
    units = prompt_pipeline()
    related, _ = assert_exact(units, model_names, initial_state(cfg_scale), final_keys=("latents", "noise", "ctx"))
    assert [u.name for u in related] == expected


def test_pruning_keeps_exactly_what_stage_two_reads():
    units = prompt_pipeline()
    extra = ("latents", "noise")
    *stage_one, prune = stage_one_units(units, ["dit"], extra_keys=extra)
    assert [u.name for u in stage_one] == ["shape", "prompt", "encode", "noise"]
    everywhere = {(scope, name) for scope in SCOPES for name in extra}
    assert prune.keep == everywhere | {("shared", "a"), ("shared", "cfg_scale"), ("posi", "emb"), ("nega", "emb")}
    _, cache = simulate([*stage_one, prune], initial_state(4.0))
    assert [set(part) for part in cache] == [{"a", "cfg_scale", "latents", "noise"}, {"emb"}, {"emb"}]
    related, unrelated = split_pipeline_units(units, ["dit"], final_keys=extra)
    assert mismatches(units, related, unrelated, initial_state(4.0), extra, prune.keep) == []


def test_pruning_skips_keys_stage_two_writes_before_reading():
    related = [plain("u0", ("a",), ("b",)), plain("u1", ("b", "c"), ("d",))]
    assert required_cache_keys(related) == {("shared", "a"), ("shared", "c")}
    assert required_cache_keys(related, final_keys=(("shared", "d"), ("posi", "d"))) == {
        ("shared", "a"), ("shared", "c"), ("posi", "d")}


def test_pruning_can_be_turned_off():
    units = prompt_pipeline()
    assert stage_one_units(units, ["dit"], prune_cache=False) == split_pipeline_units(units, ["dit"])[1]


def test_take_over_units_are_declared_in_every_scope():
    unit = PipelineUnit(take_over=True, input_params=("a",), output_params=("b",))
    access = unit_access(unit)
    assert access.reads == {(scope, name) for scope in SCOPES for name in ("a", "b")}
    assert access.writes == {(scope, "b") for scope in SCOPES}


def test_separate_cfg_units_read_cfg_scale():
    unit = PipelineUnit(separate_cfg=True, input_params=("a",), input_params_posi={"p": "prompt"},
                        input_params_nega={"p": "negative_prompt"}, output_params=("emb",))
    access = unit_access(unit)
    assert access.reads == {("shared", "a"), ("shared", "cfg_scale"), ("posi", "prompt"), ("nega", "negative_prompt")}
    assert access.writes == {("posi", "emb"), ("nega", "emb")}


def test_bad_arguments_name_the_value():
    with pytest.raises(TypeError, match="model_names='dit'"):
        split_pipeline_units([], "dit")
    with pytest.raises(ValueError, match="'latent'"):
        PruneCacheUnit([("latent", "x")])


def test_update_rule_is_unconditional():
    # u1 reads a from u0, which stage 2 produces itself, so u2's overwrite could stay in stage 1; U still moves it
    # (the documented price of a monotone T: one spare unit, never a wrong value).
    units = [plain("u0", writes=("a",), models=("dit",)), plain("u1", ("a",), ("b",)), plain("u2", writes=("a",))]
    related, _ = assert_exact(units, ["dit"], initial_state())
    assert [u.name for u in related] == ["u0", "u1", "u2"]
    assert mismatches(units, units[:2], units[2:], initial_state()) == []
