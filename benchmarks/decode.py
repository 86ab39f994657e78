"""CPU per picture of h5forge's decoding with Pillow alone against the faster decoders it routes to
(libspng for PNG, libjpeg-turbo for JPEG), on real pictures, every decoded value compared; and the
per-sample cost of cleaning the demo corpus both ways.

    python -m benchmarks.decode [--smoke] [--n 1000 --digits 1797 --reps 5]

What is measured and how: benchmarks/README.md, section "decode".
"""

import contextlib
import io
import time
from pathlib import Path
from unittest import mock

import numpy as np

from benchmarks.common import cli, interleaved, least_seconds, make_spec, ratio, raw_folder, save, warm


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
        "demo_images": [p.read_bytes() for p in sorted((raw / "images").glob("*.png"))],
        "demo_masks": [p.read_bytes() for p in sorted((raw / "masks").glob("*.png"))],
    }


def pillow_only():
    """Every picture decoded by Pillow, as before the faster decoders."""
    return mock.patch("h5forge.kinds.image._fast_pixels", return_value=None)


def least_cpu(fn, reps: int) -> dict[str, float]:
    """The least CPU seconds of ``fn`` with Pillow alone and routed, the rounds alternating which runs first."""
    best = {"pillow": float("inf"), "routed": float("inf")}
    for _, route in interleaved(list(best), reps):
        with pillow_only() if route == "pillow" else contextlib.nullcontext():
            best[route] = min(best[route], least_seconds(fn, 1, time.process_time))
    return best


def main() -> None:
    args = cli(__doc__, dict(n=20, digits=50, reps=1), n=1000, digits=1797, reps=5)
    from h5forge.ingest.clean import clean_batch
    from h5forge.ingest.discover import discover
    from h5forge.kinds import image

    raw = raw_folder(args.n, 224)
    warm([raw])
    groups, per_file, fast_share = corpus(raw, args.digits), {}, {}

    def decode_all(files):
        return [np.asarray(image.decode_picture(b, "bench", 64_000_000)) for b in files]

    for name, files in groups.items():
        with pillow_only():
            expected = decode_all(files)
        assert all(np.array_equal(a, b) for a, b in zip(decode_all(files), expected)), name  # the same values
        routed = [image._fast_pixels(b, image._open_unchecked(b), image.DEFAULT_MAX_DECODED) is not None for b in files]
        fast_share[name] = round(sum(routed) / len(files), 3)
        cpu = least_cpu(lambda: decode_all(files), args.reps)  # noqa: B023
        per_file[name] = {"files": len(files), **{f"{k}_ms": round(1000 * v / len(files), 4) for k, v in cpu.items()}}
    spec = make_spec(raw, raw.parent / "decode-out")
    inventory = discover(spec)
    bs = spec.compute.batch_size

    def clean():
        for i in range(0, len(inventory.samples), bs):
            clean_batch(spec, inventory.root, inventory.samples[i : i + bs])

    n = len(inventory.samples)
    sample = {"samples": n, **{f"{k}_ms": round(1000 * v / n, 4) for k, v in least_cpu(clean, args.reps).items()}}
    ratios = {f"{k}_cpu_routed_over_pillow": ratio(v["routed_ms"], v["pillow_ms"]) for k, v in per_file.items()}
    ratios["clean_batch_cpu_routed_over_pillow"] = ratio(sample["routed_ms"], sample["pillow_ms"])
    save(
        "decode",
        {
            "cpu_ms_per_file": per_file,
            "routed_share": fast_share,
            "clean_batch_cpu_ms_per_sample": sample,
            "values_equal": True,
            "ratios": ratios,
        },
        args.smoke,
    )


if __name__ == "__main__":
    main()
