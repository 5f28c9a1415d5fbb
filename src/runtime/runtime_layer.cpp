// layer runtime
