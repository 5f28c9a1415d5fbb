// layer sampling
