# GPU image: CUDA with the GPU stack (vllm, which brings CUDA torch, and DeepSpeed) installed
# from pyproject.toml by the project's own set-up script, as on a GPU box. Build from the repo
# root (docker/README.md):
#   docker build -f docker/gpu.Dockerfile -t rlsys:gpu .
#   docker run --rm -it --gpus all --shm-size=16g rlsys:gpu rlsys train
# The stack is pyproject.toml's `gpu` extra, so the image has its pins: vllm==0.32.0 with
# torch==2.13.0, whose PyPI build is for CUDA 13.0 (hosts need an NVIDIA driver >= 580).
# A devel base, not runtime: DeepSpeed and Triton compile kernels with nvcc at run time. Keep
# its CUDA release that of the pinned torch (torch.version.cuda in the image); change both
# together, e.g. --build-arg CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04.
# Never built or run here; `rlsys doctor --gpu` in the container checks it.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
# python3-dev and build-essential: Triton and DeepSpeed build extensions against Python.h.
# KubeRay starts Ray with `bash -lc`, whose /etc/profile resets PATH: profile.d puts the venv
# back ($PATH is meant literally: it expands at login).
# hadolint ignore=SC2016
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential git python3 python3-dev python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && echo 'export PATH=/opt/venv/bin:$PATH' > /etc/profile.d/rlsys-venv.sh

WORKDIR /opt/rlsys
COPY . .
ENV RLSYS_VENV=/opt/venv PATH=/opt/venv/bin:$PATH
# No GPU is visible during a build, so name the stack rather than let nvidia-smi decide.
RUN RLSYS_STACK=gpu PIP_NO_CACHE_DIR=1 bash scripts/setup.sh
CMD ["rlsys", "train"]
