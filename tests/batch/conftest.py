from tests.api.conftest import cross_encoder_folder, embedding_folder

__all__ = ["cross_encoder_folder", "embedding_folder"]
