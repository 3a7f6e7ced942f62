"""What a person looks at: pictures, reports and summaries drawn from saved features, without torch.

:mod:`~hookcli.pictures.grids` plans and writes the PNGs of ``hookcli grid``
(with :mod:`~hookcli.pictures.options`, :mod:`~hookcli.pictures.reading` and
:mod:`~hookcli.pictures.drawing`), :mod:`~hookcli.pictures.render` turns maps
into pixels (with :mod:`~hookcli.pictures.text` and
:mod:`~hookcli.pictures.flow`), :mod:`~hookcli.pictures.photos`,
:mod:`~hookcli.pictures.boxes` and :mod:`~hookcli.pictures.cams` draw over the
input photos, :mod:`~hookcli.pictures.reports` writes the HTML report (each
image's section from :mod:`~hookcli.pictures.sections`, the pieces from
:mod:`~hookcli.pictures.html`) and :mod:`~hookcli.pictures.summary` describes a
file for ``info``. A statistics file's pictures are its channels' dataset examples
(:mod:`~hookcli.pictures.examples`, chosen and written by :mod:`~hookcli.pictures.stats_grids`), and its
report (:mod:`~hookcli.pictures.stats_reports`) its layers' channels, with :mod:`~hookcli.pictures.charts`;
a comparison file's are the heatmap of its matrix (:mod:`~hookcli.pictures.compare_grids`) and a page of it
(:mod:`~hookcli.pictures.compare_reports`); :mod:`~hookcli.pictures.png` writes PNG files. It imports the
foundation modules, :mod:`hookcli.inputs` and :mod:`hookcli.storage`, nothing above.
"""
