"""The scanner: what happens to a printed log between the paper and the file. Stains and fold lines on the paper,
skew (image and mask alike, pixel for pixel), uneven illumination, resolution loss, blur, gamma, sensor noise,
greyscale and JPEG artefacts (the image only)."""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageFilter

from srforge.synthetic.style import Scanner, ScanStyle


def _field(rng, height: int, width: int, cells: int) -> np.ndarray:
    """Smooth noise in about [-1, 1]: a coarse random grid resized bicubically. float32 [H, W]"""
    coarse = rng.standard_normal((max(2, cells * height // max(width, 1) + 2), cells + 2)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse, mode="F").resize((width, height), Image.Resampling.BICUBIC)) / 1.5


def stains(rng, image: np.ndarray, count: int) -> None:
    """``count`` soft brownish blobs, darkening what is under them (curves too), into image [H, W, 3]."""
    h, w = image.shape[:2]
    ys, xs = np.ogrid[:h, :w]
    for _ in range(count):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.2, 1.0) * h, rng.uniform(0.02, 0.15) * w
        blob = np.exp(-(((ys - cy) / ry) ** 2 + ((xs - cx) / rx) ** 2)).astype(np.float32)
        tint = np.array([1.0, rng.uniform(0.8, 0.95), rng.uniform(0.55, 0.85)], np.float32)
        image *= 1 - rng.uniform(0.08, 0.35) * blob[..., None] * (1 - tint)[None, None] * 2.5


def folds(rng, image: np.ndarray, count: int) -> None:
    """``count`` fold lines across the height: a dark crease with a light side, into image [H, W, 3]."""
    w = image.shape[1]
    xs = np.arange(w, dtype=np.float32)
    for _ in range(count):
        at, spread = rng.uniform(0, w), rng.uniform(0.6, 3.0)
        crease = np.exp(-(((xs - at) / spread) ** 2)) * rng.uniform(0.15, 0.4)
        light = np.exp(-(((xs - at - 2.5 * spread) / (2 * spread)) ** 2)) * rng.uniform(0.0, 0.1)
        image *= (1 - crease + light)[None, :, None]


def skew(image: np.ndarray, mask: np.ndarray, scanner: Scanner, fill) -> tuple[np.ndarray, np.ndarray]:
    """The same rotation about the centre and shear for image [H, W, 3] and mask [H, W], both by nearest pixel,
    so that every mask pixel lands where its image pixel does. Returns uint8 copies."""
    h, w = mask.shape
    if scanner.skew == 0 and scanner.shear == 0:
        return np.clip(image, 0, 255).astype(np.uint8), mask
    c, s = math.cos(scanner.skew), math.sin(scanner.skew)
    shear = scanner.shear / w
    # Output (x, y) reads input (a x + b y + c0, d x + e y + f0): a rotation, then the depth axis drifting.
    a, b, d, e = c, s, -s + shear, c
    cx, cy = w / 2, h / 2
    affine = (a, b, cx - a * cx - b * cy, d, e, cy - d * cx - e * cy)
    rgb = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))
    moved = rgb.transform((w, h), Image.Transform.AFFINE, affine, Image.Resampling.NEAREST, fillcolor=fill)
    labels = Image.fromarray(mask).transform(
        (w, h), Image.Transform.AFFINE, affine, Image.Resampling.NEAREST, fillcolor=0
    )
    return np.asarray(moved), np.asarray(labels)


def _blur(rgb: Image.Image, sigma: float, classic: bool) -> Image.Image:
    if sigma <= 0.05:
        return rgb
    if classic:  # a 3x3 Gaussian: the classic scanner's softness is under a pixel (20x cheaper than PIL's)
        a = float(np.exp(-1 / (2 * sigma**2)))
        return rgb.filter(ImageFilter.Kernel((3, 3), [a * a, a, a * a, a, 1, a, a * a, a, a * a]))
    return rgb.filter(ImageFilter.GaussianBlur(sigma))


def _optics(rng, rgb: Image.Image, scanner: Scanner, classic: bool) -> Image.Image:
    """Resolution loss (down and up again) and blur."""
    w, h = rgb.size
    if scanner.downsample > 1:
        small = (max(1, round(w / scanner.downsample)), max(1, round(h / scanner.downsample)))
        rgb = rgb.resize(small, Image.Resampling.BOX).resize((w, h), Image.Resampling.BILINEAR)
    return _blur(rgb, scanner.blur, classic)


def _sensor(rng, image: np.ndarray, scanner: Scanner) -> np.ndarray:
    """Illumination, gamma, noise and greyscale on image float32 [H, W, 3]; uint8 [H, W, 3]."""
    h, w = image.shape[:2]
    if scanner.illumination > 0:
        ramp = np.linspace(-1, 1, w, dtype=np.float32)[None, :] * rng.uniform(-1, 1)
        field = 0.5 * (ramp + _field(rng, h, w, int(rng.integers(2, 6))))
        image *= (1 - scanner.illumination * (0.5 + 0.5 * np.clip(field, -1, 1)))[..., None]
    if scanner.gamma != 1:
        image = 255 * (np.clip(image, 0, 255) / 255) ** scanner.gamma
    if scanner.noise > 0:
        image += rng.standard_normal(image.shape, dtype=np.float32) * scanner.noise
    if scanner.grey:
        image[:] = (image @ np.array([0.299, 0.587, 0.114], np.float32))[..., None]
    return np.clip(image, 0, 255).astype(np.uint8)


def _jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))


def scan(rng, image: np.ndarray, mask: np.ndarray, style: ScanStyle) -> tuple[np.ndarray, np.ndarray]:
    """The printed log image float32 [H, W, 3] and its mask uint8 [H, W] through the scanner of ``style``:
    image uint8 [H, W, 3] and mask uint8 [H, W]. Only the skew moves the mask, exactly as it moves the image."""
    scanner = style.scanner
    stains(rng, image, scanner.stains)
    folds(rng, image, scanner.folds)
    moved, mask = skew(image, mask, scanner, tuple(int(c) for c in style.paper))
    rgb = _optics(rng, Image.fromarray(moved), scanner, classic=not style.randomised)
    if not style.randomised:
        return np.asarray(rgb), mask
    image = _sensor(rng, np.asarray(rgb, dtype=np.float32), scanner)
    return (_jpeg(image, scanner.jpeg) if scanner.jpeg else image), mask
