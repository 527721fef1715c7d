# duet in a container: built from source on Debian 12 and run as a non-root user, the model
# mounted read-only at /models. Build and run:
#   docker build -t duet .
#   docker run -p 8000:8000 -v "$PWD/models:/models:ro" duet --model /models/MODEL.gguf
# (deploy/compose.yaml runs it beside Prometheus, Grafana and Redis.)

# --- build: the compiler and the -dev packages, from Debian -------------------------------------
FROM debian:12-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config \
      nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev libboost-dev libyaml-cpp-dev \
      libhiredis-dev libopenmpi-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake/ cmake/
COPY src/ src/
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_TESTS=OFF \
 && cmake --build build -j"$(nproc)" \
 && strip build/duet

# --- runtime: the shared libraries duet links, and curl for the health check ---------------------
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libspdlog1.10 libfmt9 libpcre2-8-0 libyaml-cpp0.7 libhiredis0.14 libssl3 libstdc++6 curl ca-certificates \
      libopenmpi3 openmpi-bin libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libudev1 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin duet \
 && mkdir -p /models /var/log/duet /var/lib/duet/files \
 && chown duet:duet /var/log/duet /var/lib/duet/files
COPY --from=build /src/build/duet /usr/local/bin/duet
USER duet
VOLUME ["/models"]
EXPOSE 8000
# /health answers 503 while the model loads: give a large model time before counting failures.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/health || exit 1
# SIGTERM drains running requests for up to --shutdown-timeout seconds (docker stop -t 35).
STOPSIGNAL SIGTERM
ENTRYPOINT ["duet", "serve", "--host", "0.0.0.0", "--port", "8000", "--log-format", "json"]
CMD ["--model", "/models/model.gguf"]
