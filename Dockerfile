# One image for both roles of durable-etl: `serve` (the API) and `work` (a worker replica).
# Build: docker build -t durable-etl .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
RUN cargo build --release --locked --bin durable-etl

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin durable
COPY --from=build /src/target/release/durable-etl /usr/local/bin/durable-etl
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["durable-etl"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
