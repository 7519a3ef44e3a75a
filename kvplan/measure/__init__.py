"""The GPU side: running kvplan's kernels on this GPU and fitting a calibration profile."""
