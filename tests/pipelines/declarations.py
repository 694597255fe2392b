"""Checks a pipeline's unit declarations against what the units really read and write.

The split into training stages trusts the declarations alone, so every pipeline's test runs its units on recording
state dicts and compares.
"""

import inspect

from diffsynth.diffusion.base_pipeline import unit_access


class RecordingDict(dict):
    """A dict that records the keys read from it and written to it."""

    def __init__(self, scope, data, reads, writes):
        super().__init__(data)
        self.scope, self.reads, self.writes = scope, reads, writes

    def __getitem__(self, key):
        self.reads.add((self.scope, key))
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.reads.add((self.scope, key))
        return super().get(key, default)

    def __contains__(self, key):
        self.reads.add((self.scope, key))
        return super().__contains__(key)

    def __setitem__(self, key, value):
        self.writes.add((self.scope, key))
        super().__setitem__(key, value)

    def update(self, other=(), **kwargs):
        for key, value in dict(other, **kwargs).items():
            self[key] = value


def check_declarations(pipe, inputs_shared, inputs_posi, inputs_nega):
    """Runs ``pipe.units`` in order on recording state; returns ``{unit name: problems}`` for units that lie.

    A unit lies when it reads a key it does not declare (``cfg_scale`` excepted for separate-CFG units, which the
    runner reads), writes one it does not declare, leaves a declared output unwritten on these inputs, or has a
    ``process`` whose parameters differ from its declared inputs (a ``**kwargs`` would hide reads).
    """
    problems = {}
    state = [inputs_shared, inputs_posi, inputs_nega]
    for unit in pipe.units:
        reads, writes = set(), set()
        recorded = [RecordingDict(scope, data, reads, writes) for scope, data in zip(("shared", "posi", "nega"), state)]
        state = list(pipe.unit_runner(unit, pipe, *recorded))
        declared = unit_access(unit)
        found = []
        if reads - declared.reads:
            found.append(f"reads undeclared {sorted(reads - declared.reads)}")
        if writes - declared.writes:
            found.append(f"writes undeclared {sorted(writes - declared.writes)}")
        if declared.writes - writes:
            found.append(f"never writes declared {sorted(declared.writes - writes)}")
        if not unit.take_over:
            parameters = inspect.signature(unit.process).parameters
            arguments = {*unit.input_params, *unit.input_params_posi}
            if any(p.kind is p.VAR_KEYWORD for p in parameters.values()) or set(parameters) - {"pipe"} != arguments:
                found.append(f"process{inspect.signature(unit.process)} does not match inputs {sorted(arguments)}")
        if found:
            problems[type(unit).__name__] = found
    return problems
