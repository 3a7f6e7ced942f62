"""The pages a report gives each attention block of a file of ``extract --capture attention``: every shown image's
attention in that block side by side, as grid draws it (each head's class-token attention over the patches, over the
photo with ``--overlay``), the index linking them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from hookcli.pictures.html import escaped, pager, report_page
from hookcli.pictures.reading import is_attention
from hookcli.pictures.sections import ImageSections, ReportTensor
from hookcli.storage.reader import FeatureReader

__all__ = ["attention_blocks", "block_links", "block_page_name", "write_block_pages"]

#: What a block's page shows of each image, beside the others.
STYLE = """
.blocks { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.blocks figure { margin: 0; max-width: 100%; }
.blocks img { max-width: 100%; height: auto; border: 1px solid #ddd; }
.blocks figcaption { color: #555; font-size: .85em; overflow-wrap: anywhere; }
"""


def attention_blocks(features: FeatureReader, tensors: Sequence[ReportTensor]) -> list[ReportTensor]:
    """The tensors of the report that hold an attention block's weights (or their rollout), in the file's order."""
    return [tensor for tensor in tensors if is_attention(features, tensor.key)]


def block_page_name(number: int) -> str:
    """The file of the ``number``-th block's page (from 1)."""
    return f"block-{number:03d}.html"


def block_links(blocks: Sequence[ReportTensor]) -> str:
    """The index's list of the blocks' pages."""
    items = "".join(
        f'<li><a href="{block_page_name(n)}">{escaped(tensor.key)}</a></li>' for n, tensor in enumerate(blocks, 1)
    )
    return f'<nav id="blocks" aria-label="blocks"><h2>Attention, a page a block</h2><ol>{items}</ol></nav>\n'


def write_block_pages(
    sections: ImageSections,
    blocks: Sequence[ReportTensor],
    rows: Sequence[int],
    folder: Path,
    track: Callable[[Path], Path],
    *,
    force: bool,
) -> None:
    """A page for each of ``blocks``: its picture for each of ``rows`` (the images of the report's first page)."""
    name = sections.features.name
    for number, tensor in enumerate(blocks, 1):
        title = f"{tensor.key} · {name} · hookcli report · block {number} of {len(blocks)}"
        links = pager(number, len(blocks), block_page_name)
        path = track(folder / block_page_name(number))
        with report_page(path, name, title, force=force, style=STYLE, header=links, footer=links) as out:
            shown = [row for row in rows if row < tensor.rows]
            more = f", the first {len(shown):,} images" if len(shown) < sections.longest.rows else ""
            out.write(
                f'<p><a href="index.html">Summary and images</a></p>\n<h2>{escaped(tensor.key)}</h2>\n'
                f'<p class="shape">block {number} of {len(blocks)}{more}</p>\n<div class="blocks">'
            )
            for row in shown:
                out.write(f"<figure>{sections.picture_of(tensor, row)}<figcaption>{sections.row_title(row)}")
                out.write("</figcaption></figure>\n")
            out.write("</div>\n")
