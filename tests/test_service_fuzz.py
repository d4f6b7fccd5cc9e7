"""Property-based fuzzing of the running service from its own OpenAPI schema (schemathesis):
no request, valid or not, gets a 5xx, and every invalid one gets a 4xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, status_code_conformance

from tests.service_process import ServiceProcess


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    process = ServiceProcess(tmp_path_factory.mktemp("fuzzed") / "state").start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def api_schema(service):
    schema = schemathesis.openapi.from_url(service.url + "/openapi.json", headers=service.auth)
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case, service):
    case.call_and_validate(
        base_url=service.url,
        headers=service.auth,
        checks=[not_a_server_error, negative_data_rejection, status_code_conformance],
    )
