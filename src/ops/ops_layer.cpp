// layer ops
