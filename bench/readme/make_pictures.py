"""Make the pictures of the README and the docs with hookcli itself, on matplotlib's photo of Grace Hopper (random
weights: nothing is downloaded): a grid, a CAM overlay and a screenshot of a report page in headless Chromium.

Run from the repository root:  python bench/readme/make_pictures.py
Writes docs/images/grid.png, docs/images/cam.png and docs/images/report.png.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IMAGES = Path(__file__).resolve().parent.parent.parent / "docs" / "images"


def _hookcli(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "hookcli", *args], check=True, capture_output=True, text=True)
    return done.stdout.split()


def _screenshot(page: Path, target: Path, work: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1100,900",
        f"--user-data-dir={work / 'profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    try:
        driver.get(page.as_uri() + "#image-0")
        driver.save_screenshot(str(target))
    finally:
        driver.quit()


def _small(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        image.convert("RGB").save(path, optimize=True)


def main() -> None:
    import matplotlib.cbook

    photo = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        os.environ["TORCH_HOME"] = str(work / "torch")
        features = work / "vgg16_bn-features.18.safetensors"
        _hookcli(
            "extract",
            "-m",
            "vgg16_bn",
            "-w",
            "none",
            "-l",
            "features.18",
            "-l",
            "classifier.6=logits",
            photo,
            "-o",
            str(features),
            "-q",
        )
        [grid] = _hookcli("grid", str(features), "-k", "features.18", "--channels", "0:32", "-o", str(work / "g"))
        shutil.copy(grid, IMAGES / "grid.png")
        written = _hookcli("cam", "-m", "resnet50", "-w", "none", photo, "-o", str(work / "cams"), "-q")
        shutil.copy(next(p for p in written if p.endswith(".png")), IMAGES / "cam.png")
        [index] = _hookcli("report", str(features), "-o", str(work / "report"), "--top", "16")
        _screenshot(Path(index), IMAGES / "report.png", work)
    for name in ("grid.png", "cam.png", "report.png"):
        _small(IMAGES / name)
        print(IMAGES / name)


if __name__ == "__main__":
    main()
