"""The stage-1 cache: exact round trips, the cache info check, fingerprints in headers, corrupt files, atomic writes,
the manifest and stage 2's completeness check."""

import json
import tempfile

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from diffsynth.core.data import (CACHE_FORMAT_VERSION, CACHE_INFO_FILE, CACHE_MANIFEST_FILE, CacheDataset,
                                 CacheError, DataFileNotFoundError, DatasetError, FileIdentity, SampleFingerprint,
                                 cache_file_path, list_cache_files, load_cache_sample, make_cache_info,
                                 read_cache_fingerprint, read_cache_info, read_cache_manifest, save_cache_sample,
                                 write_cache_info, write_cache_manifest)
from diffsynth.core.data.cache import restamp_cache_sample
from diffsynth.core.safetensors_stream import SafetensorsStream

INFO = {"model_files": ["vae/diffusion_pytorch_model.safetensors"], "units": ["PromptEmbedder", "VAEEncoder"],
        "keys": ["latents", "prompt_emb"]}


def assert_same(expected, got, path="state"):
    """Exact equality: same Python types (tuple is not list, bool is not int), bit-identical tensors and images."""
    assert type(got) is type(expected), f"{path}: {type(expected).__name__} came back as {type(got).__name__}"
    if isinstance(expected, torch.Tensor):
        assert (got.dtype, got.shape, got.device.type) == (expected.dtype, expected.shape, "cpu"), path
        as_bytes = [tensor.detach().reshape(-1).contiguous().view(torch.uint8) for tensor in (expected, got)]
        assert torch.equal(*as_bytes), f"{path}: values differ"
    elif isinstance(expected, Image.Image):
        assert (got.mode, got.size, got.tobytes()) == (expected.mode, expected.size, expected.tobytes()), path
    elif isinstance(expected, float):
        assert repr(got) == repr(expected), path  # repr tells -0.0 from 0.0 and compares nan
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), path
        for index, (left, right) in enumerate(zip(expected, got, strict=True)):
            assert_same(left, right, f"{path}/{index}")
    elif isinstance(expected, dict):
        assert list(got) == list(expected), f"{path}: keys or their order differ"
        for key in expected:
            assert_same(expected[key], got[key], f"{path}/{key}")
    else:
        assert got == expected, path


def round_trip(state, folder):
    path = cache_file_path(folder, 0, 0)
    save_cache_sample(path, state, INFO)
    return load_cache_sample(path)


def images():
    gradient = Image.linear_gradient("L").resize((20, 12))
    return {
        "rgb": Image.merge("RGB", [gradient, gradient.transpose(Image.Transpose.FLIP_LEFT_RIGHT), gradient]),
        "rgba": Image.new("RGBA", (5, 7), (1, 2, 3, 4)),
        "l": gradient,
        "bits": gradient.convert("1"),
        "int32": gradient.convert("I"),
        "float32": gradient.convert("F"),
        "int16": Image.new("I;16", (3, 2), 513),
    }


def test_a_pipeline_like_state_round_trips_exactly(tmp_path):
    latents = torch.randn(1, 16, 4, 4, dtype=torch.bfloat16)
    base = torch.arange(12, dtype=torch.float32)
    state = {
        "shared": {
            "latents": latents,
            "input_latents": latents,                      # the same tensor twice
            "height": 64, "width": 48, "cfg_scale": 1.0, "denoising_strength": 0.75, "seed": None,
            "tiled": False, "num_frames": 1, "rand_device": "cpu",
            "whole": base, "second_half": base[6:],   # overlapping views of one buffer
            "transposed": torch.arange(6, dtype=torch.int64).reshape(2, 3).t(),
            "grad": torch.ones(3, requires_grad=True) * 2,
            "scalar": torch.tensor(7, dtype=torch.int8),
            "empty": torch.zeros(0, 3, dtype=torch.float16),
            "mask": torch.tensor([True, False]),
            "special": torch.tensor([float("nan"), -0.0, float("inf")], dtype=torch.float64),
            "input_image": images()["rgb"],
            "images": images(),
            "size": (64, 48), "sizes": [(64, 48), [64, 48]],
            "nested": {"a/b": {"c%d": [1, 2.0, True, None, "x", (torch.ones(2, dtype=torch.bfloat16),)]}},
            "floats": [-0.0, float("nan"), float("inf"), 1e-320, 2 ** 70, 0.1],
            "text": "ünïcödé / \"quoted\" \n newline",
            "": "empty key",
        },
        "posi": {"prompt_emb": torch.randn(1, 7, 32, dtype=torch.bfloat16), "prompt_emb_mask": torch.ones(1, 7).bool()},
        "nega": {},
    }
    got = round_trip(state, tmp_path)
    assert_same(state, got)
    assert got["shared"]["latents"] is got["shared"]["input_latents"], "a tensor held twice must come back as one"
    assert not got["shared"]["grad"].requires_grad


def test_tensors_are_stored_under_readable_names(tmp_path):
    state = {"shared": {"latents": torch.zeros(2)}, "posi": {"embs": [torch.ones(1), {"a/b": torch.ones(1)}]},
             "nega": {}}
    path = save_cache_sample(tmp_path / "0" / "0.safetensors", state, INFO)
    names = set(safetensors.torch.load_file(path))
    assert names == {"shared/latents", "posi/embs/0", "posi/embs/1/a%2Fb"}


DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31)))
    values = torch.randn(shape, generator=generator) * 100
    return values > 0 if dtype == torch.bool else values.to(dtype)


leaves = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
                   st.text(max_size=8), tensors())
values = st.recursive(leaves, lambda children: st.one_of(
    st.lists(children, max_size=3), st.lists(children, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=5), children, max_size=3)), max_leaves=12)
branches = st.dictionaries(st.text(max_size=6), values, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared=branches, posi=branches, nega=branches)
def test_any_nested_state_round_trips_exactly(shared, posi, nega):
    state = {"shared": shared, "posi": posi, "nega": nega}
    with tempfile.TemporaryDirectory() as folder:
        assert_same(state, round_trip(state, folder))


@pytest.mark.parametrize("state, names", [
    ({"shared": {"gen": torch.Generator()}, "posi": {}, "nega": {}}, ["shared/gen", "Generator"]),
    ({"shared": {"deep": [{"x": {1, 2}}]}, "posi": {}, "nega": {}}, ["shared/deep/0/x", "set"]),
    ({"shared": {"ids": {3: "three", "x": 1}}, "posi": {}, "nega": {}}, ["shared/ids", "key 3"]),
    ({"shared": {"img": Image.new("P", (2, 2))}, "posi": {}, "nega": {}}, ["shared/img", "convert('RGB')"]),
    ({"shared": {}, "posi": {}}, ["'nega'"]),
    ({"shared": {}, "posi": [], "nega": {}}, ["state['posi']", "list"]),
])
def test_values_the_cache_cannot_store_are_named_and_nothing_is_written(tmp_path, state, names):
    path = tmp_path / "0" / "0.safetensors"
    with pytest.raises(CacheError) as error:
        save_cache_sample(path, state, INFO)
    for name in names:
        assert name in str(error.value)
    assert not path.exists()


def test_layout_and_file_ordering(tmp_path):
    assert cache_file_path(tmp_path, 2, 17) == tmp_path / "2" / "17.safetensors"
    with pytest.raises(CacheError, match="sample_index"):
        cache_file_path(tmp_path, 0, -1)
    state = {"shared": {}, "posi": {}, "nega": {}}
    # Files are named by the sample's index in the whole dataset, so that index orders them first.
    expected = [cache_file_path(tmp_path, process, sample) for sample in (0, 1, 9, 10) for process in (0, 2, 10)]
    for path in reversed(expected):
        save_cache_sample(path, state, INFO)
    (tmp_path / "0" / ".3.safetensors.abc.tmp").write_bytes(b"partial")
    (tmp_path / "0" / "notes.safetensors").write_bytes(b"x")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "1.safetensors").write_bytes(b"x")
    assert list_cache_files(tmp_path) == expected


def test_a_save_leaves_no_temporary_file(tmp_path):
    save_cache_sample(cache_file_path(tmp_path, 0, 0), {"shared": {"x": torch.ones(3)}, "posi": {}, "nega": {}}, INFO)
    assert [path.name for path in (tmp_path / "0").iterdir()] == ["0.safetensors"]


def failing_close(stream, close=SafetensorsStream.close):
    close(stream)
    stream.path.write_bytes(b"half a file")
    raise OSError("disk full")


def test_a_save_that_fails_leaves_no_file_and_keeps_an_older_one(tmp_path, monkeypatch):
    old = {"shared": {"x": torch.zeros(2)}, "posi": {}, "nega": {}}
    kept = save_cache_sample(cache_file_path(tmp_path, 0, 0), old, INFO)
    monkeypatch.setattr(SafetensorsStream, "close", failing_close)
    new = {"shared": {"x": torch.ones(2)}, "posi": {}, "nega": {}}
    for index in (0, 1):
        with pytest.raises(OSError, match="disk full"):
            save_cache_sample(cache_file_path(tmp_path, 0, index), new, INFO)
    assert sorted(path.name for path in (tmp_path / "0").iterdir()) == ["0.safetensors"]
    assert_same(old, load_cache_sample(kept))


def corrupt_copies(path):
    """Damaged versions of the cache file ``path``: truncated, zeroed header, garbage, and a foreign file."""
    data = path.read_bytes()
    foreign = path.with_name("foreign.safetensors")
    safetensors.torch.save_file({"x": torch.ones(2)}, foreign)
    return {"truncated": data[: len(data) // 2], "zeroed": b"\x00" * 8 + data[8:], "garbage": b"not safetensors",
            "foreign": foreign.read_bytes(), "bad_structure": _with_metadata(path, structure='{"shared": {}}')}


def _with_metadata(path, structure):
    with safetensors.safe_open(str(path), "pt") as handle:
        metadata = {**handle.metadata(), "diffsynth.cache.structure": structure}
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    target = path.with_name("restructured.safetensors")
    safetensors.torch.save_file(tensors, target, metadata=metadata)
    return target.read_bytes()


FINGERPRINT = SampleFingerprint({"files": "f", "row": "r", "settings": "s", "models": "m"},
                                (FileIdentity("a.png", 10, 123, "ab" * 32),))


def test_the_fingerprint_is_read_from_the_header_and_re_stamped_without_touching_the_tensors(tmp_path):
    state = {"shared": {"x": torch.arange(5.0)}, "posi": {}, "nega": {}}
    path = save_cache_sample(tmp_path / "0" / "0.safetensors", state, INFO, FINGERPRINT)
    assert read_cache_fingerprint(path) == FINGERPRINT
    touched = SampleFingerprint(FINGERPRINT.parts, (FileIdentity("a.png", 10, 456, "ab" * 32),))
    restamp_cache_sample(path, touched)
    assert read_cache_fingerprint(path) == touched
    assert_same(state, load_cache_sample(path, expected_info=INFO))
    assert read_cache_fingerprint(save_cache_sample(tmp_path / "0" / "1.safetensors", state, INFO)) is None


def test_corrupt_files_have_no_fingerprint_and_loading_one_names_it_and_the_fix(tmp_path):
    path = save_cache_sample(tmp_path / "0" / "0.safetensors", {"shared": {"x": torch.ones(64)}, "posi": {},
                                                                 "nega": {}}, INFO, FINGERPRINT)
    assert read_cache_fingerprint(path) == FINGERPRINT
    assert read_cache_fingerprint(tmp_path / "0" / "1.safetensors") is None
    for kind, data in corrupt_copies(path).items():
        broken = tmp_path / "broken" / f"{kind}.safetensors"
        broken.parent.mkdir(exist_ok=True)
        broken.write_bytes(data)
        if kind != "bad_structure":  # its header is fine; only decoding finds the damage
            assert read_cache_fingerprint(broken) is None, kind
        with pytest.raises(CacheError) as error:
            load_cache_sample(broken)
        assert str(broken) in str(error.value) and "delete it" in str(error.value), kind


def test_a_file_from_a_newer_format_asks_for_an_upgrade(tmp_path):
    path = tmp_path / "0" / "0.safetensors"
    path.parent.mkdir()
    metadata = {"diffsynth.cache.format_version": "99", "diffsynth.cache.structure": "{}",
                "diffsynth.cache.info": "{}", "diffsynth.cache.fingerprint": FINGERPRINT.to_json()}
    safetensors.torch.save_file({"x": torch.ones(1)}, path, metadata=metadata)
    assert read_cache_fingerprint(path) is None
    with pytest.raises(CacheError, match="upgrade diffsynth"):
        load_cache_sample(path)


@pytest.fixture
def cache(tmp_path):
    """A finished cache of three samples (dataset indices 0 to 2) written by two processes."""
    write_cache_info(tmp_path, INFO)
    write_cache_manifest(tmp_path, 3, {}, "accelerate launch train.py --task sft:data_process")
    for process, sample in ((0, 0), (1, 1), (0, 2)):
        state = {"shared": {"id": f"{process}-{sample}", "latents": torch.randn(2, 2, dtype=torch.bfloat16)},
                 "posi": {"prompt_emb": torch.randn(3)}, "nega": {}}
        save_cache_sample(cache_file_path(tmp_path, process, sample), state, INFO)
    return tmp_path


def test_cache_dataset_reads_samples_in_order_and_repeats(cache):
    dataset = CacheDataset(cache, expected_info=INFO, repeat=2)
    assert len(dataset) == 6
    ids = [dataset[index]["shared"]["id"] for index in range(6)]
    assert ids == ["0-0", "1-1", "0-2"] * 2
    sample = dataset[0]
    assert set(sample) == {"shared", "posi", "nega"}
    assert sample["shared"]["latents"].dtype == torch.bfloat16 and sample["posi"]["prompt_emb"].device.type == "cpu"
    with pytest.raises(IndexError):
        dataset[6]
    with pytest.raises(DatasetError, match="--dataset_repeat"):
        CacheDataset(cache, repeat=0)


def test_cache_info_is_written_once_and_equal_after_normalisation(cache):
    stored = read_cache_info(cache)
    assert stored == {**INFO, "format_version": CACHE_FORMAT_VERSION}
    assert json.loads((cache / CACHE_INFO_FILE).read_text()) == stored
    tupled = {key: tuple(value) for key, value in INFO.items()}
    assert make_cache_info(tupled) == stored
    CacheDataset(cache, expected_info=tupled)
    write_cache_info(cache, tupled)  # a resumed stage 1 with the same settings
    with pytest.raises(CacheError) as error:
        write_cache_info(cache, {**INFO, "units": ["PromptEmbedder"]})
    assert "units" in str(error.value) and "--output_path" in str(error.value)
    assert "model_files" not in str(error.value), "fields that agree must not be listed"


def test_a_mismatched_cache_names_the_differing_fields_and_the_fix(cache):
    expected = {**INFO, "model_files": ["other/vae.safetensors"], "extra": 1}
    with pytest.raises(CacheError) as error:
        CacheDataset(cache, expected_info=expected)
    message = str(error.value)
    assert "model_files" in message and "other/vae.safetensors" in message and "extra" in message
    assert "units:" not in message and "keys:" not in message
    assert "--task sft:data_process" in message and "--dataset_base_path" in message


def test_a_file_from_another_run_fails_when_read(cache):
    state = {"shared": {"id": "stray"}, "posi": {}, "nega": {}}
    stray = save_cache_sample(cache_file_path(cache, 1, 3), state, {**INFO, "units": ["Other"]})
    write_cache_manifest(cache, 4, {}, None)
    dataset = CacheDataset(cache, expected_info=INFO)
    assert dataset[0]["shared"]["id"] == "0-0"
    with pytest.raises(CacheError) as error:
        dataset[3]
    assert str(stray) in str(error.value) and "units" in str(error.value)


def test_a_corrupt_file_in_the_dataset_names_it(cache):
    path = cache_file_path(cache, 1, 1)
    path.write_bytes(path.read_bytes()[:100])
    dataset = CacheDataset(cache)
    with pytest.raises(CacheError) as error:
        dataset[1]
    assert str(path) in str(error.value) and "sft:data_process" in str(error.value)


def test_a_folder_that_is_not_a_cache(tmp_path):
    with pytest.raises(DataFileNotFoundError, match="--dataset_base_path"):
        CacheDataset(tmp_path / "absent")
    with pytest.raises(CacheError) as error:
        CacheDataset(tmp_path)
    assert CACHE_INFO_FILE in str(error.value) and "sft:data_process" in str(error.value)
    write_cache_info(tmp_path, INFO)
    with pytest.raises(CacheError, match=CACHE_MANIFEST_FILE):
        CacheDataset(tmp_path)
    write_cache_manifest(tmp_path, 2, {}, None)
    with pytest.raises(CacheError, match="no cache files"):
        CacheDataset(tmp_path)
    (tmp_path / CACHE_INFO_FILE).write_text("{not json")
    with pytest.raises(CacheError, match=CACHE_INFO_FILE):
        CacheDataset(tmp_path)


def test_cache_info_must_be_json():
    with pytest.raises(CacheError) as error:
        make_cache_info({"dtype": torch.bfloat16})
    assert "plain JSON" in str(error.value) and "dtype" in str(error.value)


def test_an_incomplete_cache_is_refused_with_the_count_and_the_command_unless_partial_is_allowed(cache, caplog):
    cache_file_path(cache, 1, 1).unlink()
    with pytest.raises(CacheError) as error:
        CacheDataset(cache, expected_info=INFO)
    message = str(error.value)
    assert "1 of its 3 samples are missing" in message and "rows 2" in message
    assert "accelerate launch train.py --task sft:data_process" in message and "--allow_partial_cache" in message
    dataset = CacheDataset(cache, expected_info=INFO, allow_partial=True)
    assert [dataset[index]["shared"]["id"] for index in range(len(dataset))] == ["0-0", "0-2"]
    assert "1 of its 3 samples are missing" in caplog.text


def test_samples_stage_one_skipped_do_not_count_as_missing(cache):
    cache_file_path(cache, 1, 1).unlink()
    write_cache_manifest(cache, 3, {1: "row 2 (column 'image': b.png): truncated"}, None)
    assert len(CacheDataset(cache, expected_info=INFO)) == 2
    assert read_cache_manifest(cache)["skipped"] == {1: "row 2 (column 'image': b.png): truncated"}


def test_files_no_stage_one_run_wrote_are_refused(cache):
    state = {"shared": {"id": "copy"}, "posi": {}, "nega": {}}
    copy = save_cache_sample(cache_file_path(cache, 1, 2), state, INFO)
    with pytest.raises(CacheError, match="two process folders") as error:
        CacheDataset(cache, expected_info=INFO)
    assert "rerun stage 1" in str(error.value)
    copy.unlink()
    save_cache_sample(cache_file_path(cache, 0, 7), state, INFO)
    with pytest.raises(CacheError, match="beyond its 3 samples"):
        CacheDataset(cache, expected_info=INFO)
