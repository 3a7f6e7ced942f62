"""What a person looks at: pictures, reports and summaries drawn from saved features, without torch.

``grid``: :mod:`~hookcli.pictures.grids`, :mod:`~hookcli.pictures.reading`, :mod:`~hookcli.pictures.drawing`,
:mod:`~hookcli.pictures.render`, :mod:`~hookcli.pictures.png`; over photos: :mod:`~hookcli.pictures.photos`,
:mod:`~hookcli.pictures.boxes`, :mod:`~hookcli.pictures.cams`; ``report``: :mod:`~hookcli.pictures.reports`; ``info``:
:mod:`~hookcli.pictures.summary`; statistics files: :mod:`~hookcli.pictures.stats_grids`,
:mod:`~hookcli.pictures.examples`, :mod:`~hookcli.pictures.stats_reports`, :mod:`~hookcli.pictures.charts`; comparison
files: :mod:`~hookcli.pictures.compare_grids`, :mod:`~hookcli.pictures.compare_reports`. It imports only the foundation
modules, :mod:`hookcli.inputs` and :mod:`hookcli.storage`.
"""
