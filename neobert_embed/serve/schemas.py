"""Request and response bodies of the server (they also make the OpenAPI docs at ``/docs``).

Why: wrong types (strict: ``123`` is not turned into ``"123"``), empty lists, unknown fields or ``k``
out of range are refused with 422 and a message naming the field before any work is queued.

Example:
    >>> EmbeddingsRequest.model_validate({"input": ["a cat"], "model": "minilm"}).texts
    ['a cat']
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
from pydantic.functional_validators import AfterValidator

NonEmptyTexts = Annotated[list[StrictStr], Field(min_length=1)]
Texts = Annotated[StrictStr | NonEmptyTexts,  # one text or a non-empty list of them: a list once validated
                  AfterValidator(lambda texts: [texts] if isinstance(texts, str) else texts)]
MAX_K = 1000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EmbeddingsRequest(_Strict):
    """OpenAI ``POST /v1/embeddings``; ``prompt_name`` is an extension (default: the model's own)."""

    texts: Texts = Field(alias="input", description="A text or a non-empty list of texts.")
    model: StrictStr = Field(description="The served model's name (see GET /v1/models).")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: JSON numbers; base64: little-endian float32 bytes, base64-encoded.")
    dimensions: StrictInt | None = Field(None, ge=1, description="Matryoshka truncation (renormalized).")
    user: StrictStr | None = Field(None, description="Accepted for compatibility; unused.")
    prompt_name: StrictStr | None = Field(None, description="One of the model's prompts (extension).")


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "neobert-embed"
    precision: dict[str, Any] | None = None  # the compute precision and why (an extension of OpenAI's card)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class EmbedRequest(_Strict):
    """TEI ``POST /embed``."""

    texts: Texts = Field(alias="inputs")
    normalize: StrictBool = Field(True, description="L2-normalize the vectors (TEI's default).")
    truncate: StrictBool | None = Field(None, description="Truncate too-long inputs instead of answering 413 "
                                  "(default: the server's --truncate).")
    truncation_direction: Literal["right", "Right"] = "right"
    prompt_name: StrictStr | None = None
    dimensions: StrictInt | None = Field(None, ge=1, description="Matryoshka truncation.")


class SearchRequest(_Strict):
    """``POST /search``: one ``query`` or a list of ``queries`` against a served index."""

    query: StrictStr | None = None
    queries: NonEmptyTexts | None = None
    k: StrictInt = Field(10, ge=1, le=MAX_K, description="Documents per query.")
    index: StrictStr | None = Field(None, description="Index name (its directory name); default: the first.")

    @model_validator(mode="after")
    def _one_of(self) -> SearchRequest:
        if (self.query is None) == (self.queries is None):
            raise ValueError("give exactly one of 'query' (a string) or 'queries' (a list of strings)")
        blank = [i for i, text in enumerate(self.texts) if not text.strip()]
        if blank:
            where = "'query'" if self.query is not None else f"'queries'[{blank[0]}]"
            raise ValueError(f"{where} is empty; give the text to search for")
        return self

    @property
    def texts(self) -> list[str]:
        """The queries as a list."""
        return [self.query] if self.query is not None else list(self.queries or [])


class SearchHit(BaseModel):
    rank: int
    id: str
    score: float
    title: str
    text: str
    span: list[int] | None = None  # an index of passages: the best passage's characters of text, [start, end)


class QueryResult(BaseModel):
    query: str
    hits: list[SearchHit]


class SearchResponse(BaseModel):
    index: str
    documents: int
    results: list[QueryResult]


class ErrorBody(BaseModel):
    message: str
    type: str
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody
