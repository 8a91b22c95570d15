//! The ports as [`HttpCardProcessor`] keeps them: each call one request to its path, each
//! answer read as the processor reported it.

use async_trait::async_trait;
use payments_domain::{
    CancelOutcome, CardProcessor, PayoutProcessor, ProcessorCapture, ProcessorCaptureRequest,
    ProcessorCharge, ProcessorChargeRequest, ProcessorError, ProcessorPayout,
    ProcessorPayoutRequest, ProcessorRefund, ProcessorRefundRequest, ProcessorVoid,
    ProcessorVoidRequest,
};

use super::HttpCardProcessor;
use super::reported::{
    reported, reported_capture, reported_charge, reported_payout, reported_refund, reported_void,
};
use crate::wire::{CaptureBody, Metadata, PayoutBody, RefundBody, VoidBody};

#[async_trait]
impl CardProcessor for HttpCardProcessor {
    async fn charge(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError> {
        self.create_charge(request, None).await
    }

    async fn find_charge(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorCharge>, ProcessorError> {
        let view = self.find(self.charges_url.clone(), idempotency_key).await?;
        view.map(reported_charge).transpose()
    }

    async fn cancel(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCharge>, ProcessorError> {
        let outcome = self.cancel_key(&self.cancel_url, idempotency_key).await?;
        reported(outcome, reported_charge)
    }

    async fn refund(
        &self,
        request: ProcessorRefundRequest,
    ) -> Result<ProcessorRefund, ProcessorError> {
        let ProcessorRefundRequest {
            idempotency_key,
            processor_charge_id,
            money,
            metadata,
        } = request;
        let body = RefundBody {
            charge: processor_charge_id,
            amount: money.amount.minor_units(),
            currency: money.currency.code().to_owned(),
            metadata: Metadata::of(Some(&metadata)),
        };
        reported_refund(
            self.create(&self.refunds_url, &idempotency_key, &body)
                .await?,
        )
    }

    async fn find_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorRefund>, ProcessorError> {
        self.find(self.refunds_url.clone(), idempotency_key)
            .await?
            .map(reported_refund)
            .transpose()
    }

    async fn cancel_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorRefund>, ProcessorError> {
        let url = &self.refund_cancel_url;
        reported(
            self.cancel_key(url, idempotency_key).await?,
            reported_refund,
        )
    }

    async fn authorize(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError> {
        self.create_charge(request, Some(false)).await
    }

    async fn capture(
        &self,
        request: ProcessorCaptureRequest,
    ) -> Result<ProcessorCapture, ProcessorError> {
        let ProcessorCaptureRequest {
            idempotency_key,
            processor_charge_id,
            money,
            metadata,
        } = request;
        let body = CaptureBody {
            charge: processor_charge_id,
            amount: money.amount.minor_units(),
            currency: money.currency.code().to_owned(),
            metadata: Metadata::of(Some(&metadata)),
        };
        reported_capture(
            self.create(&self.captures_url, &idempotency_key, &body)
                .await?,
        )
    }

    async fn cancel_capture(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCapture>, ProcessorError> {
        let url = &self.capture_cancel_url;
        reported(
            self.cancel_key(url, idempotency_key).await?,
            reported_capture,
        )
    }

    async fn void(&self, request: ProcessorVoidRequest) -> Result<ProcessorVoid, ProcessorError> {
        let body = VoidBody {
            charge: request.processor_charge_id,
            metadata: Metadata::of(Some(&request.metadata)),
        };
        reported_void(
            self.create(&self.voids_url, &request.idempotency_key, &body)
                .await?,
        )
    }

    async fn cancel_void(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorVoid>, ProcessorError> {
        let url = &self.void_cancel_url;
        reported(self.cancel_key(url, idempotency_key).await?, reported_void)
    }
}

#[async_trait]
impl PayoutProcessor for HttpCardProcessor {
    async fn payout(
        &self,
        request: ProcessorPayoutRequest,
    ) -> Result<ProcessorPayout, ProcessorError> {
        let body = PayoutBody {
            amount: request.money.amount.minor_units(),
            currency: request.money.currency.code().to_owned(),
            destination: request.destination.as_str().to_owned(),
            metadata: Metadata::of(Some(&request.metadata)),
        };
        let view = self
            .create(&self.payouts_url, &request.idempotency_key, &body)
            .await?;
        reported_payout(view)
    }

    async fn find_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorPayout>, ProcessorError> {
        let view = self.find(self.payouts_url.clone(), idempotency_key).await?;
        view.map(reported_payout).transpose()
    }

    async fn cancel_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorPayout>, ProcessorError> {
        let url = &self.payout_cancel_url;
        reported(
            self.cancel_key(url, idempotency_key).await?,
            reported_payout,
        )
    }
}
