"""The decoded-scan cache (data.cache): hits equal fresh decodes bit for bit, nothing stale or half-written is ever
served, a budget or a full disk stops the adding and never the reading or the training."""

import errno
import multiprocessing
import os
import zipfile

import numpy as np
import pytest
import torch
from helpers import labels, rgb, scan_folder, write
from PIL import Image

import srforge.data.cache as cache_module
from srforge.cli import main_check_data
from srforge.config import ConfigError, resolve
from srforge.data.archive import ScanArchive
from srforge.data.cache import MARKER, CacheWarning, DecodedCache, folder_bytes
from srforge.data.datasets import SegmentationFolder
from srforge.data.field_view import FieldView
from srforge.data.images import DataError, DataWarning, read_image, read_mask


def entries(root):
    return sorted(root.rglob("*.npy"))


def counting(monkeypatch):
    """Count the decodings the cache asks for (hits ask for none)."""
    calls = []
    for name, real in (("read_image", cache_module.read_image), ("read_mask", cache_module.read_mask)):
        monkeypatch.setattr(cache_module, name, lambda *a, real=real, **k: calls.append(a[0]) or real(*a, **k))
    return calls


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_a_hit_equals_a_fresh_decode_bit_for_bit_without_decoding(tmp_path, monkeypatch, mode, channels_last):
    image = write(tmp_path / "a.png", np.dstack([rgb(9, 13), labels(9, 13, 250)]), "RGBA")
    mask8 = write(tmp_path / "m.png", labels(9, 13))
    mask16 = write(tmp_path / "m16.png", labels(9, 13).astype(np.uint16) * 300 + 7)
    cache = DecodedCache(tmp_path / "cache", channels_last=channels_last)
    calls = counting(monkeypatch)
    misses = [cache.read_image(image, mode), cache.read_mask(mask8), cache.read_mask(mask16)]
    hits = [cache.read_image(image, mode), cache.read_mask(mask8), cache.read_mask(mask16)]
    fresh = [read_image(image, mode), read_mask(mask8), read_mask(mask16)]
    assert len(calls) == 3 and len(entries(tmp_path / "cache")) == 3
    assert [t.dtype for t in fresh] == [torch.uint8, torch.uint8, torch.int64]
    for miss, hit, want in zip(misses, hits, fresh):
        assert hit.dtype == want.dtype and hit.shape == want.shape
        assert torch.equal(hit, want) and torch.equal(miss, want)
    # An image hit is in the batch's layout: [C, H, W] planes, or a view of [H, W, C] pixels for channels last.
    assert hits[0].permute(1, 2, 0).is_contiguous() if channels_last else hits[0].is_contiguous()
    assert hits[1].is_contiguous() and hits[2].is_contiguous()
    hits[0].fill_(0)  # the caller's to change: the entry is mapped copy-on-write
    assert torch.equal(cache.read_image(image, mode), fresh[0]) and len(calls) == 3


def test_the_two_image_layouts_are_two_entries_and_a_mask_is_one(tmp_path, monkeypatch):
    image, mask = write(tmp_path / "a.png", rgb(9, 13, seed=3)), write(tmp_path / "m.png", labels(9, 13))
    planes, pixels = DecodedCache(tmp_path / "cache"), DecodedCache(tmp_path / "cache", channels_last=True)
    calls = counting(monkeypatch)
    for cache in (planes, pixels, planes, pixels):
        assert torch.equal(cache.read_image(image), read_image(image))
        assert torch.equal(cache.read_mask(mask), read_mask(mask))
    assert calls == [image, mask, image]  # each layout decoded once; the mask's entry serves both
    assert len(entries(tmp_path / "cache")) == 3


def test_a_changed_file_or_another_mode_is_decoded_again(tmp_path, monkeypatch):
    path = write(tmp_path / "a.png", rgb(9, 13, seed=1))
    cache = DecodedCache(tmp_path / "cache")
    calls = counting(monkeypatch)
    cache.read_image(path)
    write(path, rgb(9, 13, seed=2))
    os.utime(path, ns=(10**18, 10**18))  # a new modification time, whatever the clock's resolution
    assert torch.equal(cache.read_image(path), read_image(path)) and len(calls) == 2
    assert torch.equal(cache.read_image(path, "L"), read_image(path, "L")) and len(calls) == 3
    assert len(entries(tmp_path / "cache")) == 2  # the changed file replaced its entry; L has its own
    cache.read_image(path)
    cache.read_image(path, "L")
    assert len(calls) == 3


def _fill(root, paths, results):
    cache = DecodedCache(root)
    results.put([bool(torch.equal(cache.read_image(p), read_image(p))) for p in paths])


def test_two_processes_fill_one_cache(tmp_path):
    folder = scan_folder(tmp_path / "data", n=8)
    paths = sorted((folder / "images").glob("*.png"))
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_fill, args=(tmp_path / "cache", paths[::step], results)) for step in (1, -1)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0] and all(all(o) for o in outcomes)
    assert len(entries(tmp_path / "cache")) == 8 and not list((tmp_path / "cache").rglob("*srforge-tmp"))
    cache = DecodedCache(tmp_path / "cache")
    assert all(torch.equal(cache.read_image(p), read_image(p)) for p in paths)


def test_a_cache_past_its_budget_stops_adding_says_so_once_and_reads_on(tmp_path, monkeypatch):
    paths = [write(tmp_path / f"s{i}.png", rgb(20, 30, i)) for i in range(6)]
    DecodedCache(tmp_path / "probe").read_image(paths[0])
    budget = 2.5 * folder_bytes(tmp_path / "probe") / 1e9  # room for two of the scans, not three
    cache = DecodedCache(tmp_path / "cache", max_gb=budget)
    with pytest.warns(CacheWarning) as said:
        images = [cache.read_image(p) for p in paths + paths]
    assert len(said) == 1 and "data.cache_max_gb" in str(said[0].message) and "training goes on" in str(said[0].message)
    assert cache.stopped == "budget" and len(entries(tmp_path / "cache")) == 2
    assert folder_bytes(tmp_path / "cache") <= budget * 1e9
    assert all(torch.equal(a, read_image(p)) for a, p in zip(images, paths + paths))


def test_a_full_disk_stops_caching_not_reading(tmp_path, monkeypatch):
    folder = scan_folder(tmp_path / "data", n=3)

    def full(path, write, fsync=False):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(cache_module, "atomic_write", full)
    view = FieldView(SegmentationFolder(folder), num_classes=2, cache=DecodedCache(tmp_path / "cache"))
    with pytest.warns(CacheWarning, match=r"no space left on .*cache.*training goes on") as said:
        samples = [view[i] for i in range(3)]
    assert len(said) == 1 and view.cache.stopped == "disk" and entries(tmp_path / "cache") == []
    assert all(torch.equal(s.image, read_image(p)) for s, p in zip(samples, view.dataset.image_paths))


@pytest.mark.slow
def test_training_goes_on_when_the_cache_disk_is_full(tmp_path, monkeypatch):
    from srforge.cli import main_train

    scan_folder(tmp_path / "data", n=6)

    def full(path, write, fsync=False):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(cache_module, "atomic_write", full)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"run: {{dir: {tmp_path / 'run'}, device: cpu}}\n"
        f"data: {{dataset: {{args: {{root: {tmp_path / 'data'}}}}}, cache: {tmp_path / 'cache'}, batch_size: 2}}\n"
        "model: {base_channels: 4, depth: 2}\ntrain: {epochs: 1}\n"
    )
    with pytest.warns(CacheWarning, match="no space left"):
        assert main_train(["--config", str(config)]) == 0
    assert (tmp_path / "run" / "last.pt").is_file() and entries(tmp_path / "cache") == []


@pytest.mark.parametrize("damage", ["cut", "header", "trailer", "key"])
def test_a_corrupt_entry_is_decoded_again_and_rewritten(tmp_path, monkeypatch, damage):
    path = write(tmp_path / "a.png", rgb(9, 13))
    cache = DecodedCache(tmp_path / "cache")
    cache.read_image(path)
    (entry,) = entries(tmp_path / "cache")
    data = entry.read_bytes()
    entry.write_bytes(
        {
            "cut": data[: len(data) // 2],
            "header": b"\x93NUMPY garbage" + data[14:],
            "trailer": data[:-5],
            "key": data.replace(b'"decoding": "image:RGB"', b'"decoding": "image:RGX"'),
        }[damage]
    )
    calls = counting(monkeypatch)
    assert torch.equal(cache.read_image(path), read_image(path)) and len(calls) == 1
    assert entry.read_bytes() == data  # written anew
    assert torch.equal(cache.read_image(path), read_image(path)) and len(calls) == 1


def test_a_folder_that_is_not_a_cache_is_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    with pytest.raises(DataError, match=r"mine is not a decoded-scan cache \(no \.srforge-cache marker.*thesis.tex"):
        DecodedCache(tmp_path / "mine")
    DecodedCache(tmp_path / "new" / "cache")
    assert (tmp_path / "new" / "cache" / MARKER).is_file()
    DecodedCache(tmp_path / "new" / "cache")  # its own folder, again


def test_warnings_and_the_bomb_refusal_hold_on_a_hit(tmp_path, monkeypatch):
    jpeg_mask = write(tmp_path / "m.jpg", labels(20, 20, 2) * 200)
    image = write(tmp_path / "a.png", rgb(20, 20))
    cache = DecodedCache(tmp_path / "cache")
    for _ in range(2):
        with pytest.warns(DataWarning, match=r"m.jpg: a JPEG mask is lossy"):
            cache.read_mask(jpeg_mask)
    cache.read_image(image)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150)  # 400 px: over 2x the limit
    with pytest.raises(DataError, match=r"a.png: .*MAX_IMAGE_PIXELS"):
        cache.read_image(image)


def test_a_file_that_fails_is_never_cached_and_fails_the_same(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(b"not an image")
    cache = DecodedCache(tmp_path / "cache")
    for _ in range(2):
        with pytest.raises(DataError, match=rf"{path}: cannot read as an image"):
            cache.read_image(path)
    with pytest.raises(DataError, match="nowhere.png"):
        cache.read_image(tmp_path / "nowhere.png")
    assert entries(tmp_path / "cache") == []


class PathScans(torch.utils.data.Dataset):
    """A custom Dataset that returns file paths, not pixels."""

    def __init__(self, root):
        self.images = sorted((root / "images").glob("*.png"))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"scan": str(self.images[i]), "labels": self.images[i].parent.parent / "masks" / self.images[i].name}


def test_folders_archives_and_datasets_of_paths_read_through_the_cache(tmp_path, monkeypatch):
    folder = scan_folder(tmp_path / "data", n=3)
    cache = DecodedCache(tmp_path / "cache")
    segmentation = FieldView(SegmentationFolder(folder), num_classes=2, cache=cache)
    paths = FieldView(PathScans(folder), {"image": "scan", "mask": "labels"}, num_classes=2, cache=cache)
    with zipfile.ZipFile(tmp_path / "scans.zip", "w") as zf:
        for p in sorted((folder / "images").glob("*.png")):
            zf.write(p, p.name)
    fresh = [segmentation[i] for i in range(3)]
    calls = counting(monkeypatch)
    with ScanArchive(tmp_path / "scans.zip", cache=cache) as archive:
        first = [archive.read(i) for i in range(3)]
        assert all(torch.equal(archive.read(i), first[i]) for i in range(3))
    for i in range(3):
        assert torch.equal(paths[i].image, fresh[i].image) and torch.equal(paths[i].mask, fresh[i].mask)
        assert torch.equal(segmentation[i].image, fresh[i].image) and torch.equal(first[i], fresh[i].image)
    assert calls == [] and len(entries(tmp_path / "cache")) == 9  # 3 images, 3 masks, 3 archive members


def test_check_data_fills_the_cache_with_a_progress_bar(tmp_path, capsys, monkeypatch):
    folder = scan_folder(tmp_path / "data", n=4)
    assert main_check_data([str(folder), "--num-classes", "2", "--cache", str(tmp_path / "cache")]) == 0
    assert "checking" in capsys.readouterr().err and len(entries(tmp_path / "cache")) == 8
    calls = counting(monkeypatch)
    view = FieldView(SegmentationFolder(folder), num_classes=2, cache=DecodedCache(tmp_path / "cache"))
    assert [view[i].name for i in range(4)] == ["s0", "s1", "s2", "s3"] and calls == []
    # With a config, its images are cached in the layout its batches take (train.channels_last).
    config = tmp_path / "cl.yaml"
    config.write_text(
        f"data: {{cache: {tmp_path / 'cl-cache'}}}\nmodel: {{num_classes: 2}}\ntrain: {{channels_last: true}}\n"
    )
    assert main_check_data([str(folder), "--config", str(config)]) == 0
    decoded = len(calls)
    view = FieldView(
        SegmentationFolder(folder), num_classes=2, cache=DecodedCache(tmp_path / "cl-cache", channels_last=True)
    )
    assert view[0].image.permute(1, 2, 0).is_contiguous() and len(calls) == decoded
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(SystemExit):
        main_check_data([str(folder), "--cache", str(tmp_path / "other")])
    assert "not a decoded-scan cache" in capsys.readouterr().err


def test_the_cache_keys_are_checked():
    assert resolve({"data": {"cache": "c", "cache_max_gb": 1.5}}).data.cache_max_gb == 1.5
    with pytest.raises(ConfigError, match=r"data.cache_max_gb: expected a size in GB > 0.*found -1"):
        resolve({"data": {"cache_max_gb": -1}})


# -- round five: what the cache must never serve or wait on ------------------------------------------------------
def test_a_file_rewritten_with_its_old_size_and_mtime_is_decoded_again(tmp_path):
    """As cp -p, rsync -t or tar x leave a file, or an uncompressed BMP edited in place: the key still changes."""
    mask = write(tmp_path / "m.bmp", labels(9, 13, 3))
    cache = DecodedCache(tmp_path / "cache")
    before = os.stat(mask)
    assert torch.equal(cache.read_mask(mask), torch.from_numpy(labels(9, 13, 3)))
    write(mask, np.full((9, 13), 7, np.uint8))  # every pixel 7, the same byte size
    os.utime(mask, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(mask).st_size == before.st_size and os.stat(mask).st_mtime_ns == before.st_mtime_ns
    assert (cache.read_mask(mask) == 7).all()


def test_a_fifo_at_an_entry_is_decoded_past_not_waited_on(tmp_path):
    image = write(tmp_path / "a.png", rgb(9, 13))
    cache = DecodedCache(tmp_path / "cache")
    want = cache.read_image(image)
    (entry,) = entries(tmp_path / "cache")
    entry.unlink()
    os.mkfifo(entry)
    with _within(5):  # open() of a FIFO with no writer blocks for ever
        assert torch.equal(cache.read_image(image), want)
    assert entry.is_file()  # the entry written anew over the FIFO


def test_a_fifo_in_the_data_folder_is_a_data_error_naming_it(tmp_path):
    os.mkfifo(tmp_path / "a.png")
    with _within(5), pytest.raises(DataError, match=r"a\.png: not a regular file"):
        read_image(tmp_path / "a.png")


def test_an_entry_whose_shape_is_not_the_files_is_decoded_again(tmp_path):
    """An entry with the right key but other pixels' shape ([3, 40, 50] for a 9 x 13 scan) is not served."""
    image = write(tmp_path / "a.png", rgb(9, 13))
    cache = DecodedCache(tmp_path / "cache")
    want = cache.read_image(image)
    (entry,) = entries(tmp_path / "cache")
    raw = entry.read_bytes()
    trailer = raw[raw.rindex(cache_module.TRAILER) :]
    with open(entry, "wb") as f:
        np.lib.format.write_array(f, np.zeros((3, 40, 50), np.uint8), allow_pickle=False)
        f.write(trailer)
    got = cache.read_image(image)
    assert got.shape == (3, 9, 13) and torch.equal(got, want)


def test_check_data_refuses_an_infinite_cache_budget_without_a_traceback(tmp_path, capsys):
    root = scan_folder(tmp_path / "data", n=2)
    with pytest.raises(SystemExit) as stop:  # a usage error, as argparse gives one
        main_check_data([str(root), "--num-classes", "2", "--cache", str(tmp_path / "c"), "--cache-max-gb", "inf"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "data.cache_max_gb: expected a finite size in GB > 0" in err
    assert "Traceback" not in err


class Hung(BaseException):
    """A block still waiting when its time was up."""


class _within:
    """Fail (instead of hanging) when the block takes more than ``seconds``."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        import signal

        def late(signum, frame):  # not an OSError (TimeoutError is one), which the cache would take as a miss
            raise Hung(f"still waiting after {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, late)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)
