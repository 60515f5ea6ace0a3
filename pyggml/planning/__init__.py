"""Planning without running: the dry run (`dryrun`), memory plans (`memory`), measurement
(`measure`), the fit search (`fit`) and plots (`plots`). Planning depends on the engine, never
the other way round."""
