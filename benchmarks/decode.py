"""CPU per picture of decoding with Pillow alone against the faster decoders h5forge routes to (libspng,
libjpeg-turbo), every value compared; and cleaning the demo corpus both ways. Method:
benchmarks/README.md, "decode".
"""

import contextlib
import io
import time
from pathlib import Path
from unittest import mock

import numpy as np

from benchmarks.common import clean_batches, cli, interleaved, least_seconds, make_spec, ratio, raw_folder, save, warm


def encoded(img, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


def corpus(raw: Path, digits: int) -> dict[str, list[bytes]]:
    """Files by group: scikit-image's pictures as shipped and re-encoded by Pillow, scikit-learn's
    digits drawn 8x larger, the demo generator's images and masks."""
    import skimage.data
    from PIL import Image
    from sklearn.datasets import load_digits

    shipped = sorted(p for p in Path(skimage.data.__file__).parent.iterdir() if p.suffix in (".png", ".jpg"))
    pictures = [Image.open(p) for p in shipped]
    drawn = (load_digits().images[:digits] * 255 / 16).round().astype(np.uint8).repeat(8, axis=1).repeat(8, axis=2)
    return {
        "skimage_shipped": [p.read_bytes() for p in shipped],
        "skimage_png": [encoded(img, "PNG") for img in pictures],
        "skimage_jpeg": [encoded(img if img.mode in ("L", "RGB") else img.convert("RGB"), "JPEG") for img in pictures],
        "digits_png": [encoded(Image.fromarray(d), "PNG") for d in drawn],
        **{f"demo_{k}": [p.read_bytes() for p in sorted((raw / k).glob("*.png"))] for k in ("images", "masks")},
    }


def pillow_only():
    return mock.patch("h5forge.kinds.image._fast_pixels", return_value=None)


def least_cpu_ms(fn, reps: int, per: int) -> dict[str, float]:
    """The least CPU ms per item of ``fn`` with Pillow alone and routed, the rounds alternating which runs first."""
    best = {"pillow": float("inf"), "routed": float("inf")}
    for _, route in interleaved(list(best), reps):
        with pillow_only() if route == "pillow" else contextlib.nullcontext():
            best[route] = min(best[route], least_seconds(fn, 1, time.process_time))
    return {f"{k}_ms": round(1000 * v / per, 4) for k, v in best.items()}


def main() -> None:
    args = cli(__doc__, dict(n=20, digits=50, reps=1), n=1000, digits=1797, reps=5)
    from h5forge._ingest.discover import discover
    from h5forge.kinds import image

    warm([raw := raw_folder(args.n, 224)])
    per_file, fast_share = {}, {}

    def decode_all(files):
        return [np.asarray(image.decode_picture(b, "bench", 64_000_000)) for b in files]

    for name, files in corpus(raw, args.digits).items():
        with pillow_only():
            expected = decode_all(files)
        assert all(np.array_equal(a, b) for a, b in zip(decode_all(files), expected)), name  # the same values
        routed = [image._fast_pixels(b, image._open_unchecked(b), image.DEFAULT_MAX_DECODED) is not None for b in files]
        fast_share[name] = round(sum(routed) / len(files), 3)
        cpu = least_cpu_ms(lambda: decode_all(files), args.reps, len(files))  # noqa: B023
        per_file[name] = {"files": len(files), **cpu}
    spec = make_spec(raw, raw.parent / "decode-out")
    inventory = discover(spec)
    n = len(inventory.samples)
    sample = {
        "samples": n,
        **least_cpu_ms(lambda: clean_batches(spec, inventory.root, inventory.samples), args.reps, n),
    }
    ratios = {f"{k}_cpu_routed_over_pillow": ratio(v["routed_ms"], v["pillow_ms"]) for k, v in per_file.items()}
    ratios["clean_batch_cpu_routed_over_pillow"] = ratio(sample["routed_ms"], sample["pillow_ms"])
    result = {"cpu_ms_per_file": per_file, "routed_share": fast_share, "clean_batch_cpu_ms_per_sample": sample}
    save("decode", result | {"values_equal": True, "ratios": ratios})


if __name__ == "__main__":
    main()
