"""Every warning code telemetry emits, each at most once per sampler (``WarningEvent.code``)."""

W_NVML_MISSING = "nvml-missing"  # the nvidia-ml-py package is not installed
W_NVML_NO_DRIVER = "nvml-no-driver"  # libnvidia-ml.so not found or the driver is not loaded
W_NVML_INIT = "nvml-init-failed"  # NVML did not start for another reason
W_GPU_NOT_FOUND = "nvml-gpu-not-found"  # no NVML device has the UUID / bus id torch reports
W_FIELD = "nvml-field-unsupported"  # one figure NVML cannot report on this GPU
W_PROCESS = "nvml-process-not-listed"  # NVML does not list this process (PID namespaces)
W_GPU_LOST = "gpu-lost"  # the GPU stopped answering mid-run
W_HOST = "host-field-unavailable"  # one host figure failing
W_SAMPLER_FAULT = "telemetry-fault"  # a sample could not be taken or handed over
