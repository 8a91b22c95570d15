//! The simulator behind the domain's ports: each method is one of the simulator's calls,
//! answered as the port states it (every conflict `Unavailable`), and each lookup and cancel
//! the one every book shares.

use async_trait::async_trait;
use payments_domain::{
    CancelOutcome, CaptureMethod, CardProcessor, PayoutProcessor, ProcessorCapture,
    ProcessorCaptureRequest, ProcessorCharge, ProcessorChargeRequest, ProcessorError,
    ProcessorPayout, ProcessorPayoutRequest, ProcessorRefund, ProcessorRefundRequest,
    ProcessorVoid, ProcessorVoidRequest,
};

use super::{ChargeCall, InMemoryCardProcessor};

#[async_trait]
impl CardProcessor for InMemoryCardProcessor {
    async fn charge(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError> {
        let answer = self.submit(request).await;
        answer.into_result().map(|made| made.value)
    }

    async fn find_charge(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorCharge>, ProcessorError> {
        self.find_value(idempotency_key)
    }

    async fn cancel(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCharge>, ProcessorError> {
        self.cancel_value(idempotency_key)
    }

    async fn refund(
        &self,
        request: ProcessorRefundRequest,
    ) -> Result<ProcessorRefund, ProcessorError> {
        let answer = self.submit_refund(request).await;
        answer.into_result().map(|made| made.value)
    }

    async fn find_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorRefund>, ProcessorError> {
        self.find_value(idempotency_key)
    }

    async fn cancel_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorRefund>, ProcessorError> {
        self.cancel_value(idempotency_key)
    }

    async fn authorize(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError> {
        let call = ChargeCall {
            capture: CaptureMethod::Manual,
            ..request.into()
        };
        let answer = self.submit(call).await;
        answer.into_result().map(|made| made.value)
    }

    async fn capture(
        &self,
        request: ProcessorCaptureRequest,
    ) -> Result<ProcessorCapture, ProcessorError> {
        let answer = self.submit_capture(request).await;
        answer.into_result().map(|made| made.value)
    }

    async fn cancel_capture(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCapture>, ProcessorError> {
        self.cancel_value(idempotency_key)
    }

    async fn void(&self, request: ProcessorVoidRequest) -> Result<ProcessorVoid, ProcessorError> {
        let answer = self.submit_void(request).await;
        answer.into_result().map(|made| made.value)
    }

    async fn cancel_void(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorVoid>, ProcessorError> {
        self.cancel_value(idempotency_key)
    }
}

#[async_trait]
impl PayoutProcessor for InMemoryCardProcessor {
    async fn payout(
        &self,
        request: ProcessorPayoutRequest,
    ) -> Result<ProcessorPayout, ProcessorError> {
        let answer = self.submit_payout(request).await;
        answer.into_result().map(|made| made.value)
    }

    async fn find_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorPayout>, ProcessorError> {
        self.find_value(idempotency_key)
    }

    async fn cancel_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorPayout>, ProcessorError> {
        self.cancel_value(idempotency_key)
    }
}
