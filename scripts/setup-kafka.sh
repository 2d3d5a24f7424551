#!/usr/bin/env bash
# Idempotent: what the project's own Kafka broker needs on a machine without Docker — a
# Java runtime and Maven (the broker's jars come from Maven Central on first use and are
# cached under ~/.cache/runwatch). Installs from Debian only what is missing.
set -euo pipefail
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup-kafka: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup-kafka: $(java -version 2>&1 | head -n1); $(mvn -v 2>/dev/null | head -n1)"
