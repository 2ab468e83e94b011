# The Chorus proxy: `chorus serve` answers the Postgres wire protocol on 6432 and REST (with the
# budget dashboard) on 8000, over the database named in the policy file.
#
#   docker build -t chorus-py .
#   docker run -v $PWD/policy.toml:/var/lib/chorus/policy.toml:ro -p 127.0.0.1:8000:8000 chorus-py
#
# docker-compose.yml runs it next to a Postgres loaded with the demo data.
# Pinned: the base image to a patch release, every Python dependency to the version the tests
# ran (deploy/constraints.txt), so a rebuild installs what was tested.
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/constraints.txt ./deploy/
COPY chorus_py ./chorus_py
COPY analyses ./analyses
COPY rewriters ./rewriters
COPY mechanisms ./mechanisms
COPY budget ./budget
COPY server ./server
RUN pip install --constraint deploy/constraints.txt . \
    && useradd --system --uid 10001 --home-dir /var/lib/chorus --create-home chorus

# The policy is mounted into /var/lib/chorus; the SQLite budget ledger it names
# (sqlite:///budget.sqlite3, relative to the policy) is written next to it, so mount a volume
# there to keep the budget across restarts.
WORKDIR /var/lib/chorus
USER chorus
EXPOSE 6432 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=3)"]
ENTRYPOINT ["chorus"]
CMD ["serve", "--policy", "/var/lib/chorus/policy.toml", "--listen", "0.0.0.0:6432", "--rest", "0.0.0.0:8000"]
