"""Every option, declared once: a run's (:mod:`~hookcli.options.run`), a grid's (:mod:`~hookcli.options.grid`) and a
comparison's (:mod:`~hookcli.options.compare`), with how they are declared (:mod:`~hookcli.options.declaring`)."""
