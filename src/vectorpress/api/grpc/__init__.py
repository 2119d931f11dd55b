"""TEI's gRPC dialect (package tei.v1): thin servicers over core.Infer, served by grpc.aio."""
